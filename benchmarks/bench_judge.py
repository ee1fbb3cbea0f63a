"""Judge benchmark: the PaperBench pinn rubric (1,963 leaves) through the local fake server.

Prints, measured in this run:
- wall time of a full grading at 200 ms model latency, as a ratio to the ideal
  (calls x latency / concurrency);
- model calls per leaf (PaperBench's SimpleJudge spends three: rank, grade, parse), with every
  leaf ranked (the default, as PaperBench) and with ranking only when files do not fit
  (`rank_always` off) on a submission whose files fit;
- calls for a snapshot with 10% of its files changed, as a ratio to the full grading.

Every prompt carries the leaf's preceding criteria (capped at the last ``--max-prior-nodes``,
PaperBench's 5 for pinn by default; 0 for no cap) and reproduce.sh.

Run: .venv/bin/python benchmarks/bench_judge.py [--latency 0.2] [--concurrency 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scoring.judge import CachedGrade, Judge, JudgeRun, MemoryGradeCache
from scoring.rubric import Rubric
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import (
    config,
    materials,
    scripted_answer,
    synthetic_files,
    synthetic_submission,
)

PINN = Path(__file__).resolve().parent.parent.parent / "shared/paperbench/papers/pinn/rubric.json"


def cache_of(run: JudgeRun) -> MemoryGradeCache:
    cache = MemoryGradeCache()
    for r in run.results.values():
        if r.valid and r.cache_key and r.score is not None:
            cache.add_grade(
                r.cache_key, CachedGrade(r.score, r.expectations, r.reality, r.explanation)
            )
        if r.ranking_key and r.ranked_paths is not None:
            cache.add_ranking(r.ranking_key, r.ranked_paths)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--max-prior-nodes", type=int, default=5)
    args = parser.parse_args()
    cap = args.max_prior_nodes or None
    if not PINN.exists():
        sys.exit(f"{PINN} is absent: the shared PaperBench data is needed")
    rubric = Rubric.load(PINN)
    leaves = rubric.stats().leaves

    with FakeOpenAI(answer=scripted_answer, latency_s=args.latency) as server:
        cfg = config(
            server.base_url, concurrency=args.concurrency, timeout_s=30.0, max_prior_nodes=cap
        )
        judge = Judge(cfg)

        started = time.monotonic()
        full = judge.grade(rubric, materials(), synthetic_submission())
        wall = time.monotonic() - started
        calls = len(full.calls)
        ideal = calls * args.latency / args.concurrency
        ranks = sum(1 for c in full.calls if c.purpose == "rank")
        assert full.complete, full.invalid[:3]

        files = synthetic_files()
        changed = ["src/pinn/losses.py", "src/pinn/optimizers.py"]  # 2 of 20 files = 10%
        for path in changed:
            files[path] = files[path].replace(b"tanh", b"softplus")
        server.reset()
        started = time.monotonic()
        incremental = judge.grade(
            rubric, materials(), synthetic_submission(files), cache=cache_of(full)
        )
        wall_incremental = time.monotonic() - started

        server.reset()
        unchanged = judge.grade(rubric, materials(), synthetic_submission(), cache=cache_of(full))

        # Files that fit, and ranking only when they do not (rank_always off; the default ranks
        # every leaf's files, as PaperBench does).
        roomy = Judge(cfg.model_copy(update={"file_token_budget": None, "rank_always": False}))
        server.reset()
        fits = roomy.grade(rubric, materials(), synthetic_submission())

    print(f"pinn: {leaves} leaves, latency {args.latency * 1000:.0f} ms, "
          f"concurrency {args.concurrency}, preceding criteria cap {cap}")  # fmt: skip
    retried = sum(1 for c in full.calls if not c.ok)
    print(f"full grading: {calls} calls ({ranks} ranking, {retried} failed and retried), "
          f"wall {wall:.1f} s, "
          f"ideal {ideal:.1f} s, ratio to ideal {wall / ideal:.2f}")  # fmt: skip
    print(f"calls per leaf (every leaf ranked, ranking shared): {calls / leaves:.3f} "
          f"(PaperBench: 3.000, ratio {calls / leaves / 3:.3f})")  # fmt: skip
    failed = sum(1 for c in fits.calls if not c.ok)
    print(f"calls per leaf (files fit, rank_always off: no ranking): "
          f"{len(fits.calls) / leaves:.3f} "
          f"({failed} failed attempts retried)")  # fmt: skip
    print(f"10% of files changed: {len(incremental.calls)} calls, ratio to full "
          f"{len(incremental.calls) / calls:.3f}, wall {wall_incremental:.1f} s")  # fmt: skip
    print(f"unchanged snapshot: {len(unchanged.calls)} calls")
    same = all(
        incremental.results[p].score == r.score
        for p, r in full.results.items()
        if not incremental.results[p].calls
    )
    print(f"cached grades equal the full grading's for untouched leaves: {same}")


if __name__ == "__main__":
    main()
