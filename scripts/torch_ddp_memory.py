"""PyTorch DDP's memory for an MLP or a GPT: the peer of `cargo xtask bench train --filter
largest`.

Trains `mlp:2W,W` (784 inputs, two hidden layers of 2W and W with ReLU, 10 classes, as dp's
built-in `mlp:2W,W`), or with `--family gpt` dp's `gpt:W,W,64W` (W layers and heads, width 64W;
`gpt_model.py`, dropout 0) on `--vocab` tokens at `--context`, with Adam under
DistributedDataParallel on `--procs` CPU processes (gloo), `--batch` random samples per process
per step, for `--steps` steps, and reports what the processes held at their peaks. DDP holds in
every process the whole model, its gradients, Adam's two moments, and its gradient buckets (a
copy of the gradients, unless `gradient_as_bucket_view`, which is off by default and here too:
the setup users run).

    python3 scripts/torch_ddp_memory.py --width 4096 --procs 2 --steps 2
    python3 scripts/torch_ddp_memory.py --family gpt --width 8 --vocab 256 --context 64

Prints one JSON object: {"torch": version, "params": count, "procs": n, "peak_rss": [each
process's peak resident bytes], "total_peak_rss": their sum, "seconds": wall time of the
steps}. Exits non-zero if a process fails (out of memory included).
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import Gpt, GptConfig  # noqa: E402


def mlp(width):
    return nn.Sequential(
        nn.Linear(784, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU(),
        nn.Linear(width, 10))


def worker(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    torch.manual_seed(0)
    if args.family == "gpt":
        n = args.width
        config = GptConfig(vocab=args.vocab, context=args.context, layers=n, heads=n,
                           dim=64 * n, dropout=0.0)
        model = nn.parallel.DistributedDataParallel(Gpt(config))
    else:
        model = nn.parallel.DistributedDataParallel(mlp(args.width))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=False)
        if args.family == "gpt":
            shape = (args.batch, args.context)
            x, y = torch.randint(0, args.vocab, shape), torch.randint(0, args.vocab, shape)
            loss = model(x, y)
        else:
            x = torch.randn(args.batch, 784)
            y = torch.randint(0, 10, (args.batch,))
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - started
    # ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params = sum(p.numel() for p in model.parameters())
    results.put((rank, peak, params, seconds))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=["mlp", "gpt"], default="mlp")
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(r, args, args.port, results))
                 for r in range(args.procs)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    if any(p.exitcode != 0 for p in processes):
        print(json.dumps({"failed": [p.exitcode for p in processes]}))
        sys.exit(1)
    got = sorted(results.get() for _ in processes)
    peaks = [peak for _, peak, _, _ in got]
    print(json.dumps({
        "torch": torch.__version__, "params": got[0][2], "procs": args.procs,
        "peak_rss": peaks, "total_peak_rss": sum(peaks), "seconds": max(s for *_, s in got),
    }))


if __name__ == "__main__":
    main()
