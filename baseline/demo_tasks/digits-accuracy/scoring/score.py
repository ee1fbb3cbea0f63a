"""Score a digits submission: accuracy of its solution.py on the protected held-out split.

Usage: python3 score.py --submission DIR [--protected DIR]
Prints {"score": accuracy, "message": ...} as its last line; {"score": null, ...} when the
submission cannot be scored (no solution.py, an exception, wrong output shape).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits


def report(score: float | None, message: str) -> None:
    print(json.dumps({"score": score, "message": message}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submission", type=Path, required=True)
    parser.add_argument(
        "--protected", type=Path, default=Path(__file__).resolve().parent.parent / "protected"
    )
    args = parser.parse_args()

    split = json.loads((args.protected / "split.json").read_text())
    x, y = load_digits(return_X_y=True)
    train, test = np.array(split["train"]), np.array(split["test"])

    solution = args.submission / "solution.py"
    if not solution.is_file():
        report(None, f"no solution.py in {args.submission}")
        return 0
    try:
        spec = importlib.util.spec_from_file_location("submission_solution", solution)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(args.submission))
        spec.loader.exec_module(module)
        predicted = np.asarray(module.train_and_predict(x[train], y[train], x[test]))
    except Exception:  # the participant's code failed: say so, do not score it 0
        report(None, "solution.py failed: " + traceback.format_exc(limit=3).strip()[-500:])
        return 0
    if predicted.shape != (len(test),):
        report(None, f"expected {len(test)} predictions, got shape {predicted.shape}")
        return 0
    accuracy = float((predicted == y[test]).mean())
    report(accuracy, f"accuracy on {len(test)} held-out digits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
