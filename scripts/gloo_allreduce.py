"""gloo, PyTorch's CPU collective backend, as the peer `cargo xtask bench comm` measures beside
dp-comm in the same run: an in-place float32 all_reduce between 2 processes on this host, at
each size given (bytes), timed as the bench times its own: a few warm-ups, then rounds until
the time budget per size is spent, the median round reported.

    python3 scripts/gloo_allreduce.py --budget-ms 1000 1048576 67108864

Prints one JSON object: {"torch": version, "rows": [[bytes, median seconds], ...]}."""

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int, sizes: list, budget_s: float, out) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(tensor)
        times = []
        started = time.perf_counter()
        # Both ranks run the same number of rounds: rank 0 decides when the budget is spent.
        while True:
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - t)
            go_on = torch.tensor([int(time.perf_counter() - started < budget_s or len(times) < 5)])
            dist.broadcast(go_on, 0)
            if not go_on.item():
                break
        rows.append([size, statistics.median(times)])
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-ms", type=float, default=1000.0)
    parser.add_argument("sizes", type=int, nargs="+")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(target=rank_main, args=(r, port, args.sizes, args.budget_ms / 1e3, out))
        for r in range(2)
    ]
    for p in processes:
        p.start()
    rows = out.get(timeout=600)
    for p in processes:
        p.join(timeout=60)
    print(json.dumps({"torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
