"""PyTorch eager training on the CPU, the peer `cargo xtask bench train` measures in the same
run: the jobs the bench trains, on 60,000 u8 images of 784 pixels held in memory (as the
built-in digits are), each batch drawn from a shuffled order and scaled to float32 as a
DataLoader over a TensorDataset would hand it over. Cross-entropy, global batch 256.

* `--case mlp`: MLP 784-512-256-10, SGD with Nesterov momentum 0.9 (dp's default job).
* `--case mlp20m`: MLP 784-4096-4096-10 (20M parameters), Adam.

    python3 scripts/torch_cpu_train.py --case mlp --threads 2 --steps 470

Prints one JSON object: {"torch": version, "threads": n, "samples_per_s": rate over the steps
after 5 warm-up steps, "peak_rss": the process's peak resident bytes}. One case a process, so
that the peak belongs to that case alone."""

import argparse
import json
import resource
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=["mlp", "mlp20m"], required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=470)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    widths = [512, 256] if args.case == "mlp" else [4096, 4096]
    layers, inputs = [], 784
    for width in widths:
        layers += [torch.nn.Linear(inputs, width), torch.nn.ReLU()]
        inputs = width
    model = torch.nn.Sequential(*layers, torch.nn.Linear(inputs, 10))
    if args.case == "mlp":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.randint(0, 256, (60_000, 784), dtype=torch.uint8)
    labels = torch.randint(0, 10, (60_000,))
    order = torch.randperm(60_000)
    batch = 256

    def step(i: int) -> None:
        at = (i * batch) % (60_000 - batch)
        index = order[at : at + batch]
        x, y = images[index].float().div_(255.0), labels[index]
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for i in range(5):
        step(i)
    started = time.perf_counter()
    for i in range(args.steps):
        step(i)
    rate = args.steps * batch / (time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "samples_per_s": rate, "peak_rss": peak}))


if __name__ == "__main__":
    main()
