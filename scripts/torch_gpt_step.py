"""PyTorch eager on the CPU, the peer for a GPT training step (`cargo bench -p dp-model --bench
gpt`): nanoGPT's character-level GPT ("gpt-mini": 6 blocks, 6 heads, 384 wide, context 256,
vocabulary 65, dropout 0.2; 10,770,816 parameters), the model of `gpt_model.py` (nanoGPT's
`model.py` with dp-model's parameter count).

One step: zero_grad(set_to_none=True), forward with cross-entropy over all B*T positions,
backward, AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1) on one fixed batch of random
tokens with random targets (torch.manual_seed(0)), in train mode (dropout on). Each step is
timed on its own after warm-up steps; the figure is the median. The CPU time the process
ran in each step is reported beside it: on a shared machine the wall clock also counts the
time other processes held the cores, and the CPU time does not.

    python3 scripts/torch_gpt_step.py --threads 1 [--batch 8] [--steps 9] [--warmup 2]
        [--memory] [--bf16]

Prints one JSON object:
    {"torch": version, "threads": n, "batch": b, "bf16": autocast, "context": 256, "params": count,
     "tokens_per_s": batch * context / median step time, "step_seconds": [each timed step],
     "cpu_seconds": median CPU time of the process per step (all its threads),
     "peak_rss_bytes": ..., "baseline_rss_bytes": ..., "step_peak_bytes": ...,
     "step_peak_method": ..., "cpu": {"model": name, "avx512f": bool, "amx_tile": bool}}

Memory is measured as the Rust bench's clean child process measures its own: the resident set
right before the model is built ("baseline_rss_bytes": after imports and the input batch), the
kernel's high-water mark reset there (writing 5 to /proc/self/clear_refs, Linux >= 4.0), then
the model, the optimizer and the steps, and VmHWM read after them. "step_peak_bytes" is that
peak minus the baseline: parameters, gradients, AdamW's moments (allocated by its first step),
the activations kept for backward, temporaries, and the pages of libtorch's code first touched
by the step. Where the reset is refused, the process's ru_maxrss stands in for VmHWM: exact if
the steps set it ("ru_maxrss"), otherwise an upper bound ("upper_bound"). "peak_rss_bytes" is
the whole process's peak, imports included. `--memory` asks for a short run (1 warm-up step and
3 timed ones, as the Rust memory child runs), unless --steps or --warmup say otherwise.
"""

import argparse
import json
import statistics
import time

import torch

from process_probe import cpu_info, current_rss_bytes, reset_hwm, ru_maxrss_bytes, vm_hwm_bytes

from gpt_model import MINI, Gpt

CONTEXT, VOCAB = MINI.context, MINI.vocab


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 9)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    parser.add_argument(
        "--memory", action="store_true", help="a short run for the memory figure (1 + 3 steps)"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="forward under torch.autocast(bfloat16)"
    )
    args = parser.parse_args()
    steps = args.steps if args.steps is not None else (3 if args.memory else 9)
    warmup = args.warmup if args.warmup is not None else (1 if args.memory else 2)
    if steps < 1:
        parser.error("--steps must be at least 1")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)

    x = torch.randint(0, VOCAB, (args.batch, CONTEXT))
    y = torch.randint(0, VOCAB, (args.batch, CONTEXT))
    prestep_peak = ru_maxrss_bytes()
    baseline = current_rss_bytes()
    hwm_reset = reset_hwm()

    model = Gpt()
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1
    )
    # parameters() lists the tied weight once.
    params = sum(p.numel() for p in model.parameters())

    def one_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(x, y)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        one_step()
    times, cpu_times = [], []
    for _ in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        one_step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)

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
        "context": CONTEXT,
        "params": params,
        "tokens_per_s": args.batch * CONTEXT / statistics.median(times),
        "step_seconds": times,
        "cpu_seconds": statistics.median(cpu_times),
        "peak_rss_bytes": max(prestep_peak, post_peak, step_top),
        "baseline_rss_bytes": baseline,
        "step_peak_bytes": max(0, step_top - baseline),
        "step_peak_method": method,
        "cpu": cpu_info(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
