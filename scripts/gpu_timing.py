"""How the GPU peer scripts time a training step: warm-up steps, then timed runs of a number of
steps each, synchronizing before the clock stops, with the device memory in use sampled
(cudaMemGetInfo, so the CUDA context and cuBLAS/cuDNN workspaces count as they do for ours)
after the warm-up and after each run."""

import time


def timed_steps(one_step, warm_up: int, runs: int, steps: int, items: int, used: int):
    """Runs `one_step` `warm_up` times, then `runs` runs of `steps` steps. Returns each run's
    items/s (`items` per step) and the most device memory in use seen, from `used` (in use
    before the first step), in bytes. Resets torch's peak-allocation statistics after the
    warm-up. Imports torch itself, so the scripts can say when it is missing."""
    import torch

    def in_use() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    for _ in range(warm_up):
        one_step()
    torch.cuda.synchronize()
    used = max(used, in_use())
    torch.cuda.reset_peak_memory_stats()
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        torch.cuda.synchronize()
        rates.append(steps * items / (time.perf_counter() - start))
        used = max(used, in_use())
    return rates, used
