"""PyTorch eager on the CPU, the peer for a GPT training step (`cargo bench -p dp-model --bench
gpt`): nanoGPT's character-level GPT ("gpt-mini": 6 blocks, 6 heads, 384 wide, context 256,
vocabulary 65, dropout 0.2; 10,770,816 parameters) laid out as nanoGPT's `model.py` lays it:

- `wte` Embedding(65, 384) and `wpe` Embedding(256, 384), summed, then dropout;
- 6 pre-norm blocks: x = x + dropout(c_proj(attention(ln_1(x)))), where attention is one
  Linear(384, 1152) to q, k and v (split, viewed as (B, T, 6, 64), transposed to heads),
  `F.scaled_dot_product_attention(q, k, v, is_causal=True)` and the heads transposed back; then
  x = x + dropout(c_proj(gelu(c_fc(ln_2(x))))) with c_fc Linear(384, 1536), GELU with the tanh
  approximation, c_proj Linear(1536, 384);
- a final LayerNorm and `lm_head` Linear(384, 65, bias=False) whose weight is `wte`'s.

Every Linear and LayerNorm has a bias. The one departure from nanoGPT is the attention
probabilities' dropout (nanoGPT passes `dropout_p` to SDPA in training): dp-model's
CausalSelfAttention has none, so neither has this peer. Initialization is nanoGPT's (normal,
std 0.02; the residual projections 0.02 / sqrt(2 * layers)).

One step: zero_grad(set_to_none=True), forward with cross-entropy over all B*T positions,
backward, AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1) on one fixed batch of random
tokens with random targets (torch.manual_seed(0)), in train mode (dropout on). Each step is
timed on its own after warm-up steps; the figure is the median. The CPU time the process
ran in each step is reported beside it: on a shared machine the wall clock also counts the
time other processes held the cores, and the CPU time does not.

    python3 scripts/torch_gpt_step.py --threads 1 [--batch 8] [--steps 9] [--warmup 2]
        [--memory]

Prints one JSON object:
    {"torch": version, "threads": n, "batch": b, "context": 256, "params": count,
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
import math
import os
import resource
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, CONTEXT, LAYERS, HEADS, DIM, DROPOUT = 65, 256, 6, 6, 384, 0.2


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(DIM, dim=2)
        q = q.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(DIM, 4 * DIM)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(DIM)
        self.mlp = Mlp()
        self.drop_1 = nn.Dropout(DROPOUT)
        self.drop_2 = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_1(self.attn(self.ln_1(x)))
        return x + self.drop_2(self.mlp(self.ln_2(x)))


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(CONTEXT, DIM)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * LAYERS))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ru_maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_hwm() -> bool:
    """Resets the kernel's peak-RSS mark of this process to its current RSS; False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return vm_hwm_bytes() <= current_rss_bytes() + (1 << 20)
    except OSError:
        return False


def cpu_info() -> dict:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "avx512f": "avx512f" in flags, "amx_tile": "amx_tile" in flags}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 9)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    parser.add_argument(
        "--memory", action="store_true", help="a short run for the memory figure (1 + 3 steps)"
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
