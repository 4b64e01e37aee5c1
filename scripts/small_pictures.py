"""Small pictures whose content is shape, not colour, and PyTorch's accuracy on them: the peer
that `dp train`'s image defaults (crop policy, flips, model) are checked against on data unlike
the built-in photographs.

    cargo xtask data export data/digits/train --out /tmp/digits-npy/train
    cargo xtask data export data/digits/eval --out /tmp/digits-npy/eval
    python3 scripts/small_pictures.py make /tmp/digits-npy /tmp/tinted --train 6000 --eval 1000
    python3 scripts/small_pictures.py train /tmp/tinted --model cnn --size 32 --epochs 10

For the photographs, `dp data photos --out OUT/train --seed 1` and `--out OUT/eval --seed 2`,
then `train OUT --model lenet --size 224`.

`make` writes OUT/train/<label>/<n>.jpg and OUT/eval/...: each digit resized to a random
24-40 pixels a side (width and height drawn apart), its strokes and background given random
colours, with pixel noise, JPEG-encoded at quality 70-95. Seeded: the same files every time.

`train` decodes every image with PIL, resizes the whole image to SIZE x SIZE (bilinear,
antialiased), scales each channel to zero mean and unit variance (the training images'
statistics), and trains as a PyTorch user would without augmentation: `cnn` (the same layers
as dp's default `cnn`: two 3x3 conv-BN-ReLU of 32, max pool, two of 64, global average pool,
linear) or `lenet` (dp's default for larger samples) with Adam at 1e-3, or `resnet20` (He et al.'s CIFAR ResNet-20) with SGD (momentum 0.9,
Nesterov, weight decay 5e-4 off biases and norms, 0.1 per 256 samples, cosine), batch 128.
Prints one JSON object with the eval accuracy. Needs numpy, pillow and torch (`pip install`).
"""

import argparse
import json
import os
import time

import numpy as np
import torch
from PIL import Image
from torch import nn


def make(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    for split, count in (("train", args.train), ("eval", args.eval)):
        images = np.load(os.path.join(args.digits, split, "image.npy"))
        labels = np.load(os.path.join(args.digits, split, "label.npy"))
        for n in range(min(count, len(images))):
            gray = images[n].astype(np.float32) / 255.0
            width, height = (int(v) for v in rng.integers(24, 41, size=2))
            gray = np.asarray(
                Image.fromarray((gray * 255).astype(np.uint8)).resize(
                    (width, height), Image.BILINEAR
                ),
                dtype=np.float32,
            )[..., None] / 255.0
            ink, paper = rng.uniform(0, 255, size=(2, 3))
            # The ink must stand out from the paper in brightness, as a digit on a page does.
            while abs(ink.mean() - paper.mean()) < 60:
                ink, paper = rng.uniform(0, 255, size=(2, 3))
            pixels = paper * (1 - gray) + ink * gray + rng.normal(0, 8, size=(height, width, 3))
            folder = os.path.join(args.out, split, str(int(labels[n])))
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                os.path.join(folder, f"{n}.jpg"), quality=int(rng.integers(70, 96))
            )


def load(folder: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of the class folders under `folder` (classes in name order, as
    torchvision's ImageFolder and `dp data import --format images` number them)."""
    xs, ys = [], []
    for label, name in enumerate(sorted(os.listdir(folder))):
        for file in sorted(os.listdir(os.path.join(folder, name))):
            image = Image.open(os.path.join(folder, name, file)).convert("RGB")
            image = image.resize((size, size), Image.BILINEAR)
            xs.append(np.asarray(image, dtype=np.float32).transpose(2, 0, 1))
            ys.append(label)
    return torch.from_numpy(np.stack(xs)), torch.tensor(ys)


def conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        *conv_bn(3, 32), *conv_bn(32, 32), nn.MaxPool2d(2),
        *conv_bn(32, 64), *conv_bn(64, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )


def lenet(classes: int, size: int) -> nn.Module:
    side = ((size // 2) - 4) // 2
    return nn.Sequential(
        nn.Conv2d(3, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * side * side, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, classes),
    )


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *conv_bn(cin, cout, stride),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet20(classes: int) -> nn.Module:
    layers, cin = [*conv_bn(3, 16)], 16
    for stage, width in enumerate((16, 32, 64)):
        for block in range(3):
            layers.append(Block(cin, width, 2 if stage > 0 and block == 0 else 1))
            cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    x, y = load(os.path.join(args.folder, "train"), args.size)
    ex, ey = load(os.path.join(args.folder, "eval"), args.size)
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True)
    x, ex = (x - mean) / std, (ex - mean) / std
    classes = int(y.max()) + 1
    model = {"cnn": cnn, "resnet20": resnet20, "lenet": lambda c: lenet(c, args.size)}[
        args.model
    ](classes)
    steps = args.epochs * (len(x) // args.batch)
    if args.model != "resnet20":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        decay = [p for p in model.parameters() if p.ndim > 1]
        rest = [p for p in model.parameters() if p.ndim <= 1]
        optimizer = torch.optim.SGD(
            [{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0}],
            lr=0.1 * args.batch / 256, momentum=0.9, nesterov=True,
        )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    started = time.perf_counter()
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(len(x))
        for k in range(len(x) // args.batch):
            take = order[k * args.batch : (k + 1) * args.batch]
            loss = nn.functional.cross_entropy(model(x[take]), y[take])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        right = sum(
            int((model(ex[k : k + 512]).argmax(1) == ey[k : k + 512]).sum())
            for k in range(0, len(ex), 512)
        )
    print(
        json.dumps(
            {
                "model": args.model,
                "size": args.size,
                "epochs": args.epochs,
                "train": len(x),
                "eval": len(ex),
                "accuracy": right / len(ex),
                "seconds": time.perf_counter() - started,
                "torch": torch.__version__,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("make")
    m.add_argument("digits")
    m.add_argument("out")
    m.add_argument("--train", type=int, default=6000)
    m.add_argument("--eval", type=int, default=1000)
    m.add_argument("--seed", type=int, default=1)
    t = commands.add_parser("train")
    t.add_argument("folder")
    t.add_argument("--model", choices=("cnn", "resnet20", "lenet"), default="cnn")
    t.add_argument("--size", type=int, default=32)
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make(args) if args.command == "make" else train(args)


if __name__ == "__main__":
    main()
