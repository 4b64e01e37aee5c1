"""PyTorch eager on the GPU, the peer of dp-model's `cuda_image_step` bench for
scripts/gpu-check.sh: one SGD training step of ResNet-20 (3x32x32, batch 512, 10 classes) and
ResNet-18 (3x224x224, batch 128, 1,000 classes), each in f32 (TF32 off, as the f32 path of
dp-model keeps cuBLAS's default math) and in bf16 (autocast, channels_last), cudnn.benchmark
on. A step is zero_grad(set_to_none=True), cross-entropy forward, backward and SGD (lr 0.1,
momentum 0.9, weight decay 5e-4), in train mode, on batches already in device memory (four
distinct ones, cycled, as the Rust bench cycles four page-locked ones).

    python3 scripts/torch_resnet_gpu_step.py            # every case, one subprocess each
    python3 scripts/torch_resnet_gpu_step.py --case resnet18:bf16
    python3 scripts/torch_resnet_gpu_step.py --dry-run  # builds the models on the CPU only

The models are the ones in dp-model's zoo: ResNet-20 from scripts/torch_resnet_step.py (the
CPU peer) and ResNet-18 as torchvision lays it out (7x7 stride-2 stem without bias, batch norm,
ReLU, 3x3 stride-2 max pool with padding 1, four stages of two basic blocks at 64, 128, 256
and 512 channels with conv1x1 + batch norm projection shortcuts where the shape changes,
global average pooling, a linear classifier; 11,689,512 parameters at 1,000 classes).

Timing as the Rust bench: 5 warm-up steps (cudnn.benchmark picks its algorithms there), then
the median of 5 runs of 20 steps (10 for ResNet-18), each run ending with
torch.cuda.synchronize(). One line per case, in the Rust bench's format:

    torch image step: resnet20 f32 batch 512, 12345 images/s (median of 5 runs of 20 steps);
    device peak 123.4 MiB (allocator), 456.7 MiB (driver, free-memory drop); 789.0 MiB
    (driver, this process, nvidia-smi)

Memory, each case in a fresh process so that no case inherits another's cache:
- allocator: torch.cuda.max_memory_allocated() over the timed runs (the peak is reset after
  the warm-up, so cudnn.benchmark's trial workspaces are left out), less the three batches
  beyond the one a step reads: it counts one batch in device memory, as the Rust bench's
  model holds one input buffer.
- driver, free-memory drop: how much the GPU's free memory (cudaMemGetInfo) fell from after
  the context and the batches existed to its lowest point sampled after the warm-up and each
  run; the Rust bench measures the same way, so these two compare. It counts the CUDA
  libraries' own workspaces and the caching allocator's reserve, and whatever another process
  does on the GPU meanwhile.
- driver, this process: the per-process figure of NVML (pynvml where importable, else
  nvidia-smi), which includes the CUDA context itself (hundreds of MiB); "n/a" where the
  process is not listed (a container's pid namespace).
"""

import argparse
import os
import statistics
import subprocess
import sys

from gpu_timing import timed_steps

MIB = 1024.0 * 1024.0
BATCHES = 4
WARM_UP_STEPS = 5
RUNS = 5
# model: (input [C, H, W], classes, batch, steps per timed run)
MODELS = {
    "resnet20": ((3, 32, 32), 10, 512, 20),
    "resnet18": ((3, 224, 224), 1000, 128, 10),
}
PRECISIONS = ("f32", "bf16")


def import_torch():
    """torch and nn, or a clear exit when PyTorch is not installed."""
    try:
        import torch
        from torch import nn
    except ImportError as error:
        sys.exit(f"torch image step: PyTorch is not installed ({error}); pip install torch")
    return torch, nn


def resnet18(classes: int = 1000):
    """torchvision's resnet18 (ImageNet layout), built from the CPU peer's BasicBlock."""
    _, nn = import_torch()
    from torch_resnet_step import BasicBlock

    layers = [
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(cin, cout, stride))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def build(model: str):
    if model == "resnet18":
        return resnet18(MODELS[model][1])
    from torch_resnet_step import resnet20

    return resnet20(MODELS[model][1])


def process_mib(torch) -> str:
    """This process's device memory as the driver reports it (NVML), or "n/a"."""
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return f"{proc.usedGpuMemory / MIB:.1f} MiB (driver, this process, pynvml)"
        return "n/a (driver, this process, pynvml: not listed)"
    except ImportError:
        pass
    except Exception as error:  # NVML errors have no common base class worth importing
        return f"n/a (driver, this process, pynvml: {error})"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"n/a (driver, this process, nvidia-smi: {error})"
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return f"{float(fields[1]):.1f} MiB (driver, this process, nvidia-smi)"
    return "n/a (driver, this process, nvidia-smi: not listed)"


def run_case(model_name: str, precision: str) -> None:
    torch, nn = import_torch()
    if not torch.cuda.is_available():
        sys.exit("torch image step: CUDA is not available to PyTorch (no GPU, or a CPU-only build)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    (channels, height, width), classes, batch, steps = MODELS[model_name]
    bf16 = precision == "bf16"
    memory_format = torch.channels_last if bf16 else torch.contiguous_format
    torch.manual_seed(7)
    batches = [
        (
            torch.rand(batch, channels, height, width, device=device).to(
                memory_format=memory_format
            ),
            torch.randint(0, classes, (batch,), device=device),
        )
        for _ in range(BATCHES)
    ]
    batch_bytes = batches[0][0].numel() * 4 + batches[0][1].numel() * 8
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used_before = total - free

    model = build(model_name).to(device=device, memory_format=memory_format)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    step = 0

    def one_step() -> None:
        nonlocal step
        x, y = batches[step % BATCHES]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1

    rates, used_peak = timed_steps(one_step, WARM_UP_STEPS, RUNS, steps, batch, used_before)
    allocator = (torch.cuda.max_memory_allocated() - (BATCHES - 1) * batch_bytes) / MIB
    driver = (used_peak - used_before) / MIB
    print(
        f"torch image step: {model_name} {precision} batch {batch}, "
        f"{statistics.median(rates):.0f} images/s (median of {RUNS} runs of {steps} steps); "
        f"device peak {allocator:.1f} MiB (allocator), {driver:.1f} MiB (driver, free-memory "
        f"drop); {process_mib(torch)}",
        flush=True,
    )


def dry_run() -> None:
    """Builds each model on the CPU and runs one small forward and backward: no GPU needed."""
    torch, nn = import_torch()
    for name, ((channels, height, width), classes, _, _) in MODELS.items():
        model = build(name)
        params = sum(p.numel() for p in model.parameters())
        x = torch.rand(2, channels, height, width)
        y = torch.randint(0, classes, (2,))
        nn.CrossEntropyLoss()(model(x), y).backward()
        print(f"torch image step: {name} built on the CPU, {params} parameters, "
              "forward and backward of 2 images ran")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Each case runs in a fresh subprocess unless --case names one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--case", metavar="MODEL:PRECISION",
        help=f"run one case in this process: MODEL in {sorted(MODELS)}, PRECISION in {PRECISIONS}",
    )
    parser.add_argument("--dry-run", action="store_true",
                        help="build the models on the CPU and run one small step; no GPU")
    args = parser.parse_args()
    # The CPU peer's model code sits beside this script.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.dry_run:
        dry_run()
        return
    if args.case:
        model, _, precision = args.case.partition(":")
        if model not in MODELS or precision not in PRECISIONS:
            parser.error(f"--case {args.case}: expected MODEL:PRECISION, e.g. resnet20:f32")
        run_case(model, precision)
        return
    torch, _ = import_torch()
    if not torch.cuda.is_available():
        sys.exit("torch image step: CUDA is not available to PyTorch (no GPU, or a CPU-only build)")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    failed = 0
    for precision in PRECISIONS:
        for model in MODELS:
            case = f"{model}:{precision}"
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", case])
            if done.returncode != 0:
                print(f"torch image step: {model} {precision}, failed (exit {done.returncode})",
                      flush=True)
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
