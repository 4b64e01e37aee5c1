"""PyTorch eager on the CPU, the peer for a language model's whole training run (`cargo xtask
bench train`'s language-model section): the GPT of `gpt_model.py` trained on a text file's
bytes with the configuration `cargo xtask train --model gpt:L,H,D` uses, and its held-out loss
over exactly the tokens dp's evaluation covers.

What is the same as dp's run, and how:

- tokens: every byte is a token (vocabulary 256), as `cargo xtask data import --format text`
  makes them; the first floor(n * (1 - eval_fraction)) bytes train and the rest are held out
  (dp-data's `import_text`, nanoGPT's `int(n * 0.9)`).
- model: `gpt:L,H,D` at the given context, without dropout (dp's `gpt:L,H,D` has none), GPT-2
  initialization (std 0.02, residual projections 0.02 / sqrt(2 L)), tied head.
- recipe: AdamW with betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on the matrices and the
  token embedding only (not on biases, norms or the position table: dp's `ParamRole::decays`;
  nanoGPT decays the position table too, dp does not, so neither does this peer), gradients
  clipped to global norm 1, and dp's default schedule (dp-train `schedule_or_default`): warmup
  over max(steps / 50, 1) steps, step s at lr (s + 1) / warmup, then a cosine from lr to 0 at
  the last step.
- loss: cross-entropy averaged over all predicted tokens of the global batch.
- held-out loss: dp's evaluation windows (dp-data `SequenceSampler::evaluation`): windows
  starting at k * context, inputs tokens[k C .. k C + C] and targets one further, the last one
  partial when (n - 1) is not a multiple of C, so every held-out token but the first is
  predicted exactly once; the loss summed over them and divided by their count.

What differs by design: the training windows. dp cuts each epoch into non-overlapping windows
at a seeded shift and visits them in a seeded permutation; this peer draws windows at uniform
random offsets as nanoGPT's `get_batch` does. Both see each token about as often, so the
losses after the same steps should agree within noise (the figure compared is seed-free in
that sense), not bit for bit.

    python3 scripts/torch_gpt_train.py --text corpus.txt --layers 4 --heads 4 --dim 128 \
        --context 128 --batch 32 --steps 300 --threads 2

Prints one JSON object: {"torch": version, "threads": n, "params": count, "steps": steps,
"eval_loss": held-out loss, "eval_tokens": tokens it covers, "train_loss": mean training loss
of the last 10% of steps (as dp's summary), "first_loss": step 0's loss, "seconds": training
time (evaluation excluded), "tokens_per_s": steps * batch * context / seconds, "cpu_seconds":
the CPU time of the process's threads from reading the text to the end of the evaluation}.
On a shared machine the wall clock also counts the time other processes held the cores, and
the CPU time less so (OpenMP's threads still spin while they wait for one another).
"""

import argparse
import json
import math
import time

import torch

from gpt_model import Gpt, GptConfig

VOCAB = 256


def lr_at(step: int, peak: float, steps: int) -> float:
    """dp-train's default schedule: `Schedule::WarmupCosine { lr, warmup: max(steps / 50, 1),
    total: steps, min_lr: 0 }`."""
    warmup = max(steps // 50, 1)
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= steps:
        return 0.0
    progress = (step - warmup) / max(steps - warmup, 1)
    return 0.5 * peak * (1.0 + math.cos(math.pi * progress))


def held_out_loss(model: Gpt, tokens: torch.Tensor, context: int, batch: int) -> tuple[float, int]:
    """The mean loss over dp's evaluation windows of `tokens` (see the module's docs)."""
    n = tokens.numel()
    full, partial = (n - 1) // context, (n - 1) % context
    starts = [k * context for k in range(full + (1 if partial else 0))]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for first in range(0, len(starts), batch):
            group = starts[first : first + batch]
            x = torch.zeros((len(group), context), dtype=torch.long)
            y = torch.full((len(group), context), -1, dtype=torch.long)
            for row, start in enumerate(group):
                targets = min(context, n - 1 - start)
                x[row, :targets] = tokens[start : start + targets]
                y[row, :targets] = tokens[start + 1 : start + 1 + targets]
                count += targets
            total += model(x, y, reduction="sum").item()
    model.train()
    return total / max(count, 1), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", required=True, help="the text file (its bytes are the tokens)")
    parser.add_argument("--eval-fraction", type=float, default=0.1)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="windows per step")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cpu_start = time.process_time()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)

    with open(args.text, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    split = math.floor(data.numel() * (1.0 - args.eval_fraction))
    train, held_out = data[:split], data[split:]
    context, batch = args.context, args.batch

    config = GptConfig(VOCAB, context, args.layers, args.heads, args.dim, args.dropout)
    model = Gpt(config)
    model.train()
    # parameters() lists the tied weight once (as wte.weight).
    params = sum(p.numel() for p in model.parameters())
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("wpe")]
    kept = [p for n, p in model.named_parameters() if p.dim() < 2 or n.startswith("wpe")]
    optimizer = torch.optim.AdamW(
        [
            {"params": decayed, "weight_decay": args.weight_decay},
            {"params": kept, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.99),
        eps=1e-8,
    )

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(train.numel() - context, (batch,))
        x = torch.stack([train[i : i + context] for i in ix])
        y = torch.stack([train[i + 1 : i + 1 + context] for i in ix])
        return x, y

    losses = []
    started = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.lr, args.steps)
        x, y = get_batch()
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - started

    eval_loss, eval_tokens = held_out_loss(model, held_out, context, batch)
    cpu_seconds = time.process_time() - cpu_start
    tail = losses[len(losses) - math.ceil(len(losses) / 10) :]
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "params": params,
                "steps": args.steps,
                "eval_loss": eval_loss,
                "eval_tokens": eval_tokens,
                "train_loss": sum(tail) / max(len(tail), 1),
                "first_loss": losses[0] if losses else None,
                "seconds": seconds,
                "tokens_per_s": args.steps * batch * context / seconds,
                "cpu_seconds": cpu_seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
