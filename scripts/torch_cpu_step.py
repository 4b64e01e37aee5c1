"""PyTorch eager on the CPU, the peer `cargo bench -p dp-model --bench step` measures beside
dp-model's step in the same run: one training step (forward, backward, SGD with momentum 0.9,
cross-entropy) of MLP 784-512-256-10 at batch 256 and of LeNet-5 (as dp-model's
`ModelSpec::lenet`: 6@5x5 padded, max-pool, 16@5x5, max-pool, 120, 84, 10) at batch 64, in
float32; and torch.mm's GFLOP/s at the GEMM shapes given, each operand read straight or
transposed as the step reads it. Timed as the bench does: warm-up, then medians.

    python3 scripts/torch_cpu_step.py --threads 1 [--gemm M,K,N,AT,BT ...]

Prints one JSON object: {"torch": version, "threads": n, "mlp_samples_per_s": ...,
"lenet_samples_per_s": ..., "gemm_gflops": [...]}."""

import argparse
import json
import statistics
import time

import torch


def step_rate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def one_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(10):
        one_step()
    rounds = []
    for _ in range(21):
        start = time.perf_counter()
        for _ in range(5):
            one_step()
        rounds.append(5 * x.shape[0] / (time.perf_counter() - start))
    return statistics.median(rounds)


def mm_rate(m: int, k: int, n: int, a_t: bool, b_t: bool) -> float:
    a = torch.rand(k, m).t() if a_t else torch.rand(m, k)
    b = torch.rand(n, k).t() if b_t else torch.rand(k, n)
    out = torch.empty(m, n)
    reps = max(1, int(2e8 / (2 * m * k * n)))
    for _ in range(3):
        torch.mm(a, b, out=out)
    rounds = []
    for _ in range(21):
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        rounds.append(2 * m * k * n * reps / (time.perf_counter() - start) / 1e9)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gemm", action="append", default=[], help="M,K,N,AT,BT (AT, BT: 0 or 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    lenet = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 5 * 5, 120), torch.nn.ReLU(),
        torch.nn.Linear(120, 84), torch.nn.ReLU(),
        torch.nn.Linear(84, 10),
    )
    labels = lambda batch: torch.randint(0, 10, (batch,))  # noqa: E731
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "mlp_samples_per_s": step_rate(mlp, torch.rand(256, 784), labels(256)),
        "lenet_samples_per_s": step_rate(lenet, torch.rand(64, 1, 28, 28), labels(64)),
        "gemm_gflops": [
            mm_rate(*(int(v) for v in shape.split(",")[:3]), *(v == "1" for v in shape.split(",")[3:]))
            for shape in args.gemm
        ],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
