"""Real photographs for `cargo xtask bench data`'s image section, beside its synthetic ones:
the two sample photographs scikit-learn ships (`load_sample_images`: a temple in China and a
flower, 640x427 each) cut and rescaled into a folder of JPEGs, one class per photograph.
Smooth real pictures favour decoders that skip work (crop-aware and scaled decoding) more
than noisy synthetic ones do, so both are measured.

    pip install scikit-learn pillow
    python3 scripts/real_photos.py OUT --count 1000

Each image is a random crop (30-100% of the photograph's area, aspect 3/4 to 4/3), resized with
PIL's Lanczos filter so that its longer side is 300 to 650 pixels, mirrored half the time, and
saved as JPEG at quality 90 (4:2:0), from a fixed seed: the same command writes the same
files. Prints one JSON object: {"images": how many, "folder": OUT}."""

import argparse
import json
import os
import random

from PIL import Image
from sklearn.datasets import load_sample_images


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    photos = [Image.fromarray(array) for array in load_sample_images().images]
    rng = random.Random(args.seed)
    for c in range(len(photos)):
        os.makedirs(os.path.join(args.out, f"photo-{c}"), exist_ok=True)
    for i in range(args.count):
        c = i % len(photos)
        photo = photos[c]
        w, h = photo.size
        for _ in range(100):
            area = w * h * rng.uniform(0.3, 1.0)
            aspect = rng.uniform(0.75, 4 / 3)
            cw, ch = round((area * aspect) ** 0.5), round((area / aspect) ** 0.5)
            if cw <= w and ch <= h:
                break
        else:
            cw, ch = w, h
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        side = rng.randint(300, 650)
        scale = side / max(cw, ch)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        image = photo.crop((x, y, x + cw, y + ch)).resize(size, Image.LANCZOS)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        image.save(os.path.join(args.out, f"photo-{c}", f"{i}.jpg"), quality=90)
    print(json.dumps({"images": args.count, "folder": args.out}))


if __name__ == "__main__":
    main()
