"""PyTorch's image input path, the peer `cargo xtask bench data` measures in the same run:
torchvision's ImageFolder over a folder of JPEGs, decoded by PIL (libjpeg-turbo),
RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3, bilinear, antialiased), a random horizontal
flip and ToTensor (float32 [C, H, W]), batched by a DataLoader with worker processes.

    python3 scripts/images_torch.py target/bench-images/photos --size 224 --batch 64 --workers 2

Prints one JSON object: {"torch", "torchvision", "pillow" versions, "images_per_s": the median
over rounds of an epoch's images over its time from the first request to the last batch,
"decode_images_per_s": PIL decoding every file to RGB on one thread, bytes in memory,
"decoder": what decoded}."""

import argparse
import io
import json
import statistics
import time

import PIL
import torch
import torchvision
from PIL import Image
from torchvision import datasets, transforms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(args.size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]
    )
    dataset = datasets.ImageFolder(args.folder, transform=transform)
    files = [open(path, "rb").read() for path, _ in dataset.samples]
    rates, decode_rates = [], []
    for _ in range(max(args.rounds, 3)):
        started = time.perf_counter()
        for data in files:
            Image.open(io.BytesIO(data)).convert("RGB")
        decode_rates.append(len(files) / (time.perf_counter() - started))
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers, drop_last=True
        )
        started, images = time.perf_counter(), 0
        for x, _ in loader:
            images += x.shape[0]
        rates.append(images / (time.perf_counter() - started))
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "torchvision": torchvision.__version__,
                "pillow": PIL.__version__,
                "images_per_s": statistics.median(rates),
                "decode_images_per_s": statistics.median(decode_rates),
                "decoder": "PIL (libjpeg-turbo) alone",
            }
        )
    )


if __name__ == "__main__":
    main()
