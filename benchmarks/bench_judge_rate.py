"""Judge throughput against a provider's limits: the fake provider runs in its own process.

PaperBench's pinn rubric (1,963 leaves), 200 ms model latency, 100 calls in flight.

1. No limit: wall time of a full grading as a ratio to the ideal (calls x latency / concurrency).
2. A tokens-per-minute limit enforced by the provider (sliding 10 s window, 429 with
   retry-after beyond it), set to `--limit-share` of the throughput measured without a limit
   in the same run (so the limit, not this machine's CPU, is what binds):
   - paced: the judge is told the limit (`tokens_per_minute`) and paces itself;
   - unpaced: the judge is not told and learns only from 429s.
   For each: the sustained rate (prompt + completion tokens the provider admitted, per minute
   of wall time) as a share of the limit, and the number of 429s.

Run: .venv/bin/python benchmarks/bench_judge_rate.py [--latency 0.2] [--concurrency 100]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scoring.judge import Judge, JudgeRun
from scoring.rubric import Rubric
from tests.scoring.judge_support import config, materials, synthetic_submission

ROOT = Path(__file__).resolve().parent.parent
PINN = ROOT.parent / "shared/paperbench/papers/pinn/rubric.json"


class Provider:
    """The fake provider as a child process."""

    def __init__(self, latency: float, tokens_per_minute: float | None) -> None:
        argv = [
            sys.executable,
            str(ROOT / "benchmarks/fake_provider.py"),
            "--latency",
            str(latency),
        ]
        if tokens_per_minute is not None:
            argv += ["--tokens-per-minute", str(tokens_per_minute)]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()

    def close(self) -> int:
        """Stop the provider; the number of requests it throttled."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        line = self.process.stdout.readline().strip()
        self.process.wait(timeout=30)
        return int(line.split()[1]) if line.startswith("throttled") else -1


def tokens_of(run: JudgeRun) -> int:
    return sum(c.prompt_tokens + c.completion_tokens for c in run.calls if c.ok)


def grade(
    rubric: Rubric, base_url: str, concurrency: int, **limits: float
) -> tuple[JudgeRun, float]:
    cfg = config(
        base_url,
        concurrency=concurrency,
        timeout_s=60.0,
        max_attempts=100,
        backoff_initial_s=0.05,
        backoff_max_s=2.0,
        **limits,
    )
    started = time.monotonic()
    run = Judge(cfg).grade(rubric, materials(), synthetic_submission())
    return run, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--limit-share", type=float, default=0.4)
    args = parser.parse_args()
    if not PINN.exists():
        sys.exit(f"{PINN} is absent: the shared PaperBench data is needed")
    rubric = Rubric.load(PINN)
    leaves = rubric.stats().leaves

    provider = Provider(args.latency, None)
    try:
        free, wall = grade(rubric, provider.base_url, args.concurrency)
    finally:
        provider.close()
    assert free.complete, free.invalid[:3]
    calls = len(free.calls)
    ideal = calls * args.latency / args.concurrency
    total_tokens = tokens_of(free)
    print(f"pinn: {leaves} leaves, latency {args.latency * 1000:.0f} ms, "
          f"concurrency {args.concurrency}, provider in its own process")  # fmt: skip
    print(f"no limit: {calls} calls, {total_tokens:,} tokens, wall {wall:.1f} s, "
          f"ideal {ideal:.1f} s, ratio to ideal {wall / ideal:.2f}")  # fmt: skip

    limit = args.limit_share * total_tokens / (wall / 60)
    for paced in (True, False):
        provider = Provider(args.latency, limit)
        try:
            extra = {"tokens_per_minute": limit} if paced else {}
            run, wall = grade(rubric, provider.base_url, args.concurrency, **extra)
        finally:
            throttled = provider.close()
        sustained = tokens_of(run) / (wall / 60)
        label = "paced (limit configured)" if paced else "unpaced (429s only)"
        print(f"TPM limit {limit:,.0f}, {label}: wall {wall:.1f} s, sustained "
              f"{sustained:,.0f} TPM = {sustained / limit:.2f} of the limit, "
              f"{throttled} requests throttled, complete {run.complete}, "
              f"invalid leaves {len(run.invalid)}")  # fmt: skip


if __name__ == "__main__":
    main()
