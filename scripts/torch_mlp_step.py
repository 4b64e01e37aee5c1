"""PyTorch eager's training step for the comparison in scripts/gpu-check.sh: MLP
784-512-256-10 in float32, cross-entropy, SGD with momentum 0.9, at batch 256 and 4096, each
batch copied from page-locked host memory (non_blocking) as a DataLoader with pin_memory
hands it over. Timed as dp-model's `cuda_step` bench: 20 warm-up steps, then the median of 5
runs of 50 steps, each run ending when the GPU has finished. TF32 is off, as in cuBLAS's
default math mode that dp-model uses."""

import statistics
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
BATCHES = 4


def rate(batch: int) -> float:
    device = torch.device("cuda")
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = [
        (torch.rand(batch, 784).pin_memory(), torch.randint(0, 10, (batch,)).pin_memory())
        for _ in range(BATCHES)
    ]
    step = 0

    def one_step() -> None:
        nonlocal step
        x, y = batches[step % BATCHES]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1

    for _ in range(20):
        one_step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(50):
            one_step()
        torch.cuda.synchronize()
        runs.append(50 * batch / (time.perf_counter() - start))
    return statistics.median(runs)


if __name__ == "__main__":
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for batch in (256, 4096):
        print(f"torch step: batch {batch}, {rate(batch):.0f} samples/s "
              "(median of 5 runs of 50 steps)")
