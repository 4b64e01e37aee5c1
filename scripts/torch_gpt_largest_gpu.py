"""The largest GPT PyTorch eager trains on one GPU within a memory budget: the peer of
`dp plan --largest gpt --device cuda --memory-budget B` for scripts/gpu-check.sh.

The family is dp's (`memory_plan/largest.rs`): size n is `gpt:n,n,64n` (n blocks, n heads,
64n wide), here with `gpt_model.py`'s GPT at the given vocabulary and context, no dropout.
A size fits when one AdamW step (lr 6e-4, betas (0.9, 0.95), weight decay 0.1, the fused
CUDA kernels) at the given batch under `torch.autocast(bfloat16)` with
`scaled_dot_product_attention` runs twice (the second step holds AdamW's moments) without
running out of memory, with the process held to the budget by
`torch.cuda.set_per_process_memory_fraction`. Sizes are searched as dp searches them:
doubling from 1, then bisection, so the answer is the largest n that fits when n + 1 does
not. Each probe runs in a fresh process (a failed allocation can leave the caching
allocator fragmented).

    python3 scripts/torch_gpt_largest_gpu.py --budget-gib 16 --vocab 256 --context 128 --batch 16
    python3 scripts/torch_gpt_largest_gpu.py --dry-run    # sizes 1 and 2 on the CPU

Prints one line:

    torch largest gpt: gpt:N,N,W (P parameters) within B GiB at batch b, context t
"""

import argparse
import subprocess
import sys

from gpt_model import Gpt, GptConfig


def config(n: int, vocab: int, context: int) -> GptConfig:
    return GptConfig(vocab=vocab, context=context, layers=n, heads=n, dim=64 * n, dropout=0.0)


def probe(n: int, args) -> None:
    """Exits 0 if size n trains two steps within the budget, 3 if it runs out of memory."""
    import torch

    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.budget_gib * 2**30 / total))
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = Gpt(config(n, args.vocab, args.context)).to(device)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True
        )
        shape = (args.batch, args.context)
        x = torch.randint(0, args.vocab, shape, device=device)
        y = torch.randint(0, args.vocab, shape, device=device)
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            loss.backward()
            optimizer.step()
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        sys.exit(3)
    print(sum(p.numel() for p in model.parameters()))


def fits(n: int, args) -> int | None:
    """The parameters of size n if it fits, else None; another failure ends the search."""
    command = [sys.executable, __file__, "--probe", str(n)] + [
        f"--{k.replace('_', '-')}={v}"
        for k, v in vars(args).items()
        if k in ("budget_gib", "vocab", "context", "batch")
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 3:
        return None
    if done.returncode != 0:
        sys.exit(f"torch largest gpt: size {n} failed: {done.stderr.strip()[-400:]}")
    return int(done.stdout.split()[-1])


def search(args, fits=fits) -> None:
    first = fits(1, args)
    if first is None:
        sys.exit(f"torch largest gpt: not even gpt:1,1,64 trains within {args.budget_gib} GiB")
    # Doubling until a size does not fit (or the largest probed does), then bisection.
    low, found, high = 1, first, None
    while high is None:
        n = min(2 * low, args.max)
        if n == low:
            high = low + 1
            break
        params = fits(n, args)
        if params is None:
            high = n
        else:
            low, found = n, params
    while high - low > 1:
        middle = (low + high) // 2
        params = fits(middle, args)
        if params is None:
            high = middle
        else:
            low, found = middle, params
    print(
        f"torch largest gpt: gpt:{low},{low},{64 * low} ({found} parameters) within "
        f"{args.budget_gib} GiB at batch {args.batch}, context {args.context}",
        flush=True,
    )


def dry_run() -> None:
    import torch

    for n in (1, 2):
        model = Gpt(config(n, 97, 16))
        x = torch.randint(0, 97, (2, 16))
        model(x, torch.randint(0, 97, (2, 16))).backward()
        params = sum(p.numel() for p in model.parameters())
        print(f"torch largest gpt: gpt:{n},{n},{64 * n} ({params} parameters) ran on the CPU")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max", type=int, default=256, help="the largest size probed")
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.dry_run:
        dry_run()
    elif args.probe is not None:
        probe(args.probe, args)
    else:
        import torch

        if not torch.cuda.is_available():
            sys.exit("torch largest gpt: CUDA is not available to PyTorch (no GPU, or a CPU-only build)")
        search(args)


if __name__ == "__main__":
    main()
