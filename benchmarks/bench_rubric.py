"""Load and aggregate the largest PaperBench rubric (pinn, 1,963 leaves) 1,000 times.

Prints the time as a ratio to plain ``json.load`` of the same file, measured in the same run, so
the number means the same on any machine. Run: ``.venv/bin/python benchmarks/bench_rubric.py``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scoring.rubric import Rubric  # noqa: E402
from scoring.rubric_scores import LeafGrade, aggregate  # noqa: E402

RUBRIC = REPO.parent / "shared" / "paperbench" / "papers" / "pinn" / "rubric.json"
ROUNDS = 1_000


def main() -> int:
    if not RUBRIC.exists():
        print(
            f"skipped: {RUBRIC} is absent (the shared PaperBench data is not beside this checkout)"
        )
        return 0
    rubric = Rubric.load(RUBRIC)
    grades = {path: LeafGrade(float(i % 2)) for i, path in enumerate(rubric.leaf_paths())}

    start = time.perf_counter()
    for _ in range(ROUNDS):
        with open(RUBRIC, "rb") as handle:
            json.load(handle)
    plain = time.perf_counter() - start

    start = time.perf_counter()
    for _ in range(ROUNDS):
        loaded = Rubric.load(RUBRIC)
        score = aggregate(loaded, grades).score
    ours = time.perf_counter() - start

    stats = rubric.stats()
    print(f"rubric: {RUBRIC.name} of pinn, {stats.leaves} leaves, {stats.nodes} nodes")
    print(f"json.load x{ROUNDS}: {plain:.3f} s")
    print(f"Rubric.load + aggregate x{ROUNDS}: {ours:.3f} s (root score {score:.6f})")
    print(f"ratio to json.load: {ours / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
