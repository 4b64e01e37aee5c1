"""PyTorch eager on the GPU, the peer of dp-model's `cuda_gpt_step` bench for
scripts/gpu-check.sh: one AdamW training step (lr 6e-4, betas (0.9, 0.95), weight decay 0.1)
of GPT-2 small (`gpt_model.py`'s GPT: 12 blocks, 12 heads, 768 wide, context 1024, the
50,257-token vocabulary, no dropout, the head tied to the token table) at batch 8, under
`torch.autocast(bfloat16)` with `F.scaled_dot_product_attention` (FlashAttention on recent
GPUs), TF32 off as on our side; with `--checkpoint`, each block recomputed in backward
(`torch.utils.checkpoint`, non-reentrant), as dp's recomputation per block.

    python3 scripts/torch_gpt_gpu_step.py [--checkpoint]
    python3 scripts/torch_gpt_gpu_step.py --dry-run   # a small GPT on the CPU: no GPU needed

Random token ids and next tokens (torch.manual_seed(7)), 4 batches cycled; 3 warm-up steps,
then 3 timed runs of 10 steps each ended by torch.cuda.synchronize(). One line, in the Rust
bench's format:

    torch gpt step: gpt2-small bf16 batch 8 context 1024, N tokens/s (median of 3 runs of 10
    steps); device peak A MiB (allocator), D MiB (driver, free-memory drop)

- allocator: torch.cuda.max_memory_allocated() over the timed runs, less the batches held;
- driver, free-memory drop: how much the GPU's free memory fell from before the model was
  built to its lowest point sampled after each run (the caching allocator's reserve and the
  libraries' workspaces included).
"""

import argparse
import statistics
import sys

from gpt_model import Gpt, GptConfig
from gpu_timing import timed_steps

GPT2_SMALL = GptConfig(vocab=50257, context=1024, layers=12, heads=12, dim=768, dropout=0.0)
BATCH, BATCHES, WARM_UP_STEPS, RUNS, STEPS = 8, 4, 3, 3, 10
MIB = 1024.0 * 1024.0


def build(torch, config: GptConfig, checkpoint: bool):
    model = Gpt(config)
    if checkpoint:
        from torch.utils.checkpoint import checkpoint as recompute

        for block in model.h:
            forward = block.forward
            block.forward = lambda x, forward=forward: recompute(forward, x, use_reentrant=False)
    return model


def run(checkpoint: bool) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("torch gpt step: CUDA is not available to PyTorch (no GPU, or a CPU-only build)")
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    torch.manual_seed(7)
    shape = (BATCH, GPT2_SMALL.context)
    batches = [
        (
            torch.randint(0, GPT2_SMALL.vocab, shape, device=device),
            torch.randint(0, GPT2_SMALL.vocab, shape, device=device),
        )
        for _ in range(BATCHES)
    ]
    batch_bytes = 2 * batches[0][0].numel() * 8
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used_before = total - free
    model = build(torch, GPT2_SMALL, checkpoint).to(device)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1
    )
    step = 0

    def one_step() -> None:
        nonlocal step
        x, y = batches[step % BATCHES]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        optimizer.step()
        step += 1

    tokens = BATCH * GPT2_SMALL.context
    rates, used_peak = timed_steps(one_step, WARM_UP_STEPS, RUNS, STEPS, tokens, used_before)
    allocator = (torch.cuda.max_memory_allocated() - (BATCHES - 1) * batch_bytes) / MIB
    driver = (used_peak - used_before) / MIB
    label = " recompute" if checkpoint else ""
    print(
        f"torch gpt step: gpt2-small bf16 batch {BATCH} context {GPT2_SMALL.context}{label}, "
        f"{statistics.median(rates):.0f} tokens/s (median of {RUNS} runs of {STEPS} steps); "
        f"device peak {allocator:.1f} MiB (allocator), {driver:.1f} MiB (driver, free-memory "
        f"drop)",
        flush=True,
    )


def dry_run() -> None:
    """A two-block GPT of the same code on the CPU, each block recomputed: one forward and
    backward, to check the script without a GPU."""
    import torch

    small = GptConfig(vocab=97, context=16, layers=2, heads=2, dim=32, dropout=0.0)
    model = build(torch, small, checkpoint=True)
    x = torch.randint(0, small.vocab, (2, small.context))
    model(x, torch.randint(0, small.vocab, (2, small.context))).backward()
    params = sum(p.numel() for p in model.parameters())
    print(f"torch gpt step: a {params}-parameter GPT built on the CPU, forward and backward ran")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", action="store_true", help="recompute each block")
    parser.add_argument("--dry-run", action="store_true", help="a small GPT on the CPU")
    args = parser.parse_args()
    if args.dry_run:
        dry_run()
    else:
        run(args.checkpoint)


if __name__ == "__main__":
    main()
