"""PyTorch eager on the CPU, the peer for a ResNet-20 training step: the CIFAR ResNet-20 of He et
al. (stem conv3x3 3->16 + BN + ReLU; three stages of three BasicBlocks at 16, 32 and 64 channels,
stride 2 entering stages 2 and 3, projection shortcuts conv1x1 + BN where the shape changes;
global average pooling; Linear 64->10), float32, NCHW 3x32x32 input, in train mode, one step
being zero_grad(set_to_none=True), cross-entropy forward, backward, and SGD (lr 0.1, momentum
0.9, weight decay 5e-4) on one fixed random batch (torch.manual_seed(0)). Timed as the Rust
benches are: warm-up steps, then the median over rounds of a few steps each.

    python3 scripts/torch_resnet_step.py --threads 1 [--batch 128] [--rounds 11]
        [--steps-per-round 3] [--warmup 3]

Prints one JSON object:
    {"torch": version, "threads": n, "batch": b, "params": count,
     "samples_per_s": median of rounds, "rounds": [samples/s of each round],
     "peak_rss_bytes": ..., "baseline_rss_bytes": ..., "prestep_peak_rss_bytes": ...,
     "step_peak_bytes": ..., "step_peak_method": ...,
     "cpu": {"model": name, "avx512f": bool, "amx_tile": bool}}

Memory. A Python process running torch carries a few hundred MB that have nothing to do with
the step (the interpreter, libtorch's code and data, import-time allocations), so the whole
process's peak cannot be compared with a Rust binary's own peak as it is. Both numbers are given:

- "peak_rss_bytes": the whole process's peak resident set over its life, imports included
  (getrusage ru_maxrss, and the larger of it before and after the steps where the kernel's
  high-water mark was reset in between; see below).
- "baseline_rss_bytes": the resident set right after imports and building the model, the
  optimizer and the input batch, before the first step (/proc/self/statm).
- "prestep_peak_rss_bytes": the process's peak up to that point (ru_maxrss); imports can
  briefly take more than the baseline holds afterwards.
- "step_peak_bytes": what the steps (warm-up included) add at their peak above the baseline:
  activations kept for backward, gradients, momentum buffers, oneDNN scratch and primitive
  caches, and the pages of libtorch code first touched by the step. It is the number to set
  beside a Rust implementation's peak minus its own pre-step resident set.

A high-water mark that imports set can hide the step's, so before the first step the script
asks the kernel to reset the process's high-water mark (writing 5 to /proc/self/clear_refs,
Linux >= 4.0) and reads VmHWM from /proc/self/status after the steps: then the step's peak is
measured on its own and "step_peak_method" is "hwm_reset". Where that reset is refused it
falls back to ru_maxrss: if the peak after the steps exceeds the pre-step peak, the steps set
it and the difference from the baseline is exact ("ru_maxrss"); otherwise the step's peak lies
somewhere below the pre-step peak and peak - baseline is only an upper bound ("upper_bound")."""

import argparse
import json
import statistics
import time

import torch

from process_probe import cpu_info, current_rss_bytes, reset_hwm, ru_maxrss_bytes, vm_hwm_bytes
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=False)
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def resnet20(classes: int = 10) -> nn.Module:
    layers = [nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for stage, cout in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(cin, cout, stride))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps-per-round", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--bf16", action="store_true", help="forward under torch.autocast(bfloat16)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)

    model = resnet20()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    params = sum(p.numel() for p in model.parameters())

    def one_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    baseline = current_rss_bytes()
    prestep_peak = ru_maxrss_bytes()
    hwm_reset = reset_hwm()

    for _ in range(args.warmup):
        one_step()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps_per_round):
            one_step()
        rounds.append(args.steps_per_round * args.batch / (time.perf_counter() - start))

    post_peak = ru_maxrss_bytes()
    if hwm_reset:
        step_top = vm_hwm_bytes()
        method = "hwm_reset"
    else:
        step_top = post_peak
        method = "ru_maxrss" if post_peak > prestep_peak else "upper_bound"
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "bf16": args.bf16,
        "params": params,
        "samples_per_s": statistics.median(rounds),
        "rounds": rounds,
        "peak_rss_bytes": max(prestep_peak, post_peak, step_top),
        "baseline_rss_bytes": baseline,
        "prestep_peak_rss_bytes": prestep_peak,
        "step_peak_bytes": max(0, step_top - baseline),
        "step_peak_method": method,
        "cpu": cpu_info(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
