"""The sparse path's accuracy against scikit-learn's LogisticRegression on the same svmlight
files. Generates a sparse binary classification set (100,000 features, about 0.05% dense:
a label that is the sign of a hidden linear score over 2,000 informative features plus
noise), writes train and test svmlight files, fits LogisticRegression on them, then imports
the same files with `cargo xtask data import --format svmlight` and trains the default job on
them (`cargo xtask train`, whose default model for a sparse input is linear), and prints both
test accuracies and their difference (the target: within 1 point).

    python3 scripts/sparse-vs-sklearn.py            # needs numpy, scipy, scikit-learn

Everything goes to a temporary directory that is removed at the end."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file
from sklearn.linear_model import LogisticRegression

FEATURES = 100_000
INFORMATIVE = 2_000
TRAIN, TEST = 20_000, 5_000
PER_ROW = 50


def make(rng: np.random.Generator, rows: int, weights: np.ndarray):
    # Half of each row's non-zeros among the informative features, half anywhere.
    informative = rng.integers(0, INFORMATIVE, size=(rows, PER_ROW // 2))
    anywhere = rng.integers(0, FEATURES, size=(rows, PER_ROW // 2))
    cols = np.concatenate([informative, anywhere], axis=1).ravel()
    row_index = np.repeat(np.arange(rows), PER_ROW)
    values = rng.uniform(0.5, 1.5, size=rows * PER_ROW)
    x = sp.csr_matrix((values, (row_index, cols)), shape=(rows, FEATURES))
    x.sum_duplicates()
    score = x @ weights + rng.normal(0.0, 0.5, size=rows)
    return x, np.where(score > 0, 1, -1)


def run(command: list, cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def main() -> int:
    rng = np.random.default_rng(7)
    weights = np.zeros(FEATURES)
    weights[:INFORMATIVE] = rng.normal(size=INFORMATIVE)
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, rows in (("train", TRAIN), ("test", TEST)):
            x, y = make(rng, rows, weights)
            dump_svmlight_file(x, y, str(tmp / f"{name}.svm"), zero_based=False)
        x_train, y_train = load_svmlight_file(str(tmp / "train.svm"), n_features=FEATURES)
        x_test, y_test = load_svmlight_file(str(tmp / "test.svm"), n_features=FEATURES)
        density = x_train.nnz / (x_train.shape[0] * FEATURES)
        started = time.perf_counter()
        model = LogisticRegression(max_iter=1000).fit(x_train, y_train)
        sklearn_s = time.perf_counter() - started
        sklearn_accuracy = model.score(x_test, y_test)

        xtask = ["cargo", "xtask"]
        for name in ("train", "test"):
            run(xtask + ["data", "import", "--format", "svmlight", str(tmp / f"{name}.svm"),
                         "--out", str(tmp / "data" / name), "--width", str(FEATURES)], repo)
        started = time.perf_counter()
        run(xtask + ["train", "--data", str(tmp / "data" / "train"),
                     "--eval-data", str(tmp / "data" / "test"), "--out", str(tmp / "runs"),
                     "--name", "sparse", "--no-plot"], repo)
        ours_s = time.perf_counter() - started
        summary = json.loads((tmp / "runs" / "sparse" / "summary.json").read_text())
        ours_accuracy = summary["eval_accuracy"]

    print(f"data: {TRAIN} train / {TEST} test records, {FEATURES} features, {100 * density:.3f}% dense")
    print(f"scikit-learn LogisticRegression: test accuracy {100 * sklearn_accuracy:.2f}% ({sklearn_s:.1f} s fit)")
    print(f"dp (cargo xtask train, defaults): test accuracy {100 * ours_accuracy:.2f}% ({ours_s:.1f} s, build included)")
    difference = 100 * (ours_accuracy - sklearn_accuracy)
    verdict = "within" if abs(difference) <= 1.0 else "NOT within"
    print(f"difference {difference:+.2f} points: {verdict} 1 point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
