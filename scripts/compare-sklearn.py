#!/usr/bin/env python3
"""Accuracy with default settings: `cargo xtask train` against scikit-learn on the same split.

For the tables scikit-learn ships (breast cancer, wine, iris, its 8x8 digits), it splits 75/25
(stratified, seed 0), trains StandardScaler + LogisticRegression and StandardScaler +
MLPClassifier, and imports the same split through `cargo xtask data import --format csv` to
train with no option beyond the data. Needs scikit-learn (`pip install scikit-learn`); run
from the workspace root: `python3 scripts/compare-sklearn.py`.
"""

import csv
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from sklearn import datasets
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

TABLES = {
    "breast cancer": datasets.load_breast_cancer,
    "wine": datasets.load_wine,
    "iris": datasets.load_iris,
    "digits 8x8": datasets.load_digits,
}


def write_csv(path, x, y):
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([f"f{i}" for i in range(x.shape[1])] + ["label"])
        for row, label in zip(x, y):
            out.writerow([repr(float(v)) for v in row] + [int(label)])


def xtask(*args):
    done = subprocess.run(
        ["cargo", "xtask", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"cargo xtask {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def dp_accuracy(work, x_train, y_train, x_eval, y_eval):
    for split, x, y in [("train", x_train, y_train), ("eval", x_eval, y_eval)]:
        write_csv(work / f"{split}.csv", x, y)
        xtask("data", "import", "--format", "csv", "--label", "label",
              "--out", str(work / split), str(work / f"{split}.csv"))
    out = xtask("train", "--data", str(work / "train"), "--eval-data", str(work / "eval"),
                "--out", str(work / "runs"), "--name", "run", "--no-plot")
    return float(re.search(r"^eval\s+accuracy ([0-9.]+)%", out, re.M).group(1)) / 100


def main():
    warnings.simplefilter("ignore", ConvergenceWarning)
    print("| table | rows (train / eval) | features | LogisticRegression | MLPClassifier "
          "| cargo xtask train |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in TABLES.items():
            x, y = load(return_X_y=True)
            split = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
            x_train, x_eval, y_train, y_eval = split
            scores = []
            for model in [LogisticRegression(max_iter=1000), MLPClassifier(random_state=0)]:
                fitted = make_pipeline(StandardScaler(), model).fit(x_train, y_train)
                scores.append(fitted.score(x_eval, y_eval))
            work = Path(tmp) / name.replace(" ", "-")
            work.mkdir()
            ours = dp_accuracy(work, x_train, y_train, x_eval, y_eval)
            print(f"| {name} | {len(y_train)} / {len(y_eval)} | {x.shape[1]} "
                  f"| {scores[0]:.3f} | {scores[1]:.3f} | {ours:.3f} |")


if __name__ == "__main__":
    main()
