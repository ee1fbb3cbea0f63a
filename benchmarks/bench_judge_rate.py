"""Judge throughput against a provider's limits: the fake provider runs in its own process.

PaperBench's pinn rubric (1,963 leaves), 200 ms model latency, 100 calls in flight.

Gradings run in the long-running portal process (its scoring worker), so what a study waits for
is a grading in a process that has started already. What a process pays once, on its first
grading (importing the openai SDK, loading the BPE tokenizer, starting the judge's worker
processes for an endpoint: about a second each on these machines), is paid here before the
clock starts and printed apart; timing it as part of one grading made the first benchmark runs
read 1.7-2.2x where a grading took 1.1x. At 100 calls in flight the judge spreads its calls over
worker processes (`scoring.llm_transport.judge_processes`: 2 on a 2-core machine).

1. No limit: wall time of a full grading as a ratio to the ideal (calls x latency / concurrency),
   `--repeats` times; the median is the result (these machines are noisy).
2. A tokens-per-minute limit enforced by the provider (sliding 10 s window, 429 with
   retry-after beyond it), set to `--limit-share` of the throughput measured without a limit
   in the same run (so the limit, not this machine's CPU, is what binds):
   - paced: the judge is told the limit (`tokens_per_minute`) and paces itself;
   - unpaced: the judge is not told and learns only from 429s.
   For each: the sustained rate (prompt + completion tokens the provider admitted, per minute
   of wall time) as a share of the limit, and the number of 429s.

Run: .venv/bin/python benchmarks/bench_judge_rate.py [--latency 0.2] [--concurrency 100]
     [--repeats 5] [--processes N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scoring.judge import Judge, JudgeRun
from scoring.llm import ChatClient, JudgeConfig, Tokenizer
from scoring.llm_workers import WorkerPool
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


def pay_process_start(encoding: str) -> None:
    """What the portal's process pays once, before its first grading; timed and printed."""
    started = time.monotonic()
    import openai  # noqa: F401  (the SDK's import is the cost)

    imported = time.monotonic()
    Tokenizer(encoding).count("warm up")
    loaded = time.monotonic()
    print(f"process start (once per process, not timed below): openai SDK import "
          f"{imported - started:.2f} s, tokenizer {encoding} "
          f"{loaded - imported:.2f} s")  # fmt: skip


def start_judge(base_url: str, concurrency: int, processes: int | None, **limits: float) -> Judge:
    """A judge for this endpoint, its worker processes started (once per process and
    endpoint, printed, not timed)."""
    started = time.monotonic()
    cfg = judge_config(base_url, concurrency, **limits)
    judge = Judge(cfg, client=ChatClient(cfg, processes=processes))
    transport = judge.client.transport
    if isinstance(transport, WorkerPool):
        print(f"  {len(transport.workers)} judge worker processes for {base_url} started in "
              f"{time.monotonic() - started:.2f} s")  # fmt: skip
    return judge


def grade(judge: Judge, rubric: Rubric) -> tuple[JudgeRun, float]:
    started = time.monotonic()
    run = judge.grade(rubric, materials(), synthetic_submission())
    return run, time.monotonic() - started


def judge_config(base_url: str, concurrency: int, **limits: float) -> JudgeConfig:
    return config(
        base_url,
        concurrency=concurrency,
        timeout_s=60.0,
        max_attempts=100,
        backoff_initial_s=0.05,
        backoff_max_s=2.0,
        **limits,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--limit-share", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        help="processes making the calls (default: the judge's own choice; 1: in the judge's)",
    )
    args = parser.parse_args()
    if not PINN.exists():
        sys.exit(f"{PINN} is absent: the shared PaperBench data is needed")
    rubric = Rubric.load(PINN)
    leaves = rubric.stats().leaves
    print(f"pinn: {leaves} leaves, latency {args.latency * 1000:.0f} ms, "
          f"concurrency {args.concurrency}, provider in its own process")  # fmt: skip
    pay_process_start(judge_config("http://127.0.0.1:1", args.concurrency).encoding)

    ratios: list[float] = []
    walls: list[float] = []
    provider = Provider(args.latency, None)
    try:
        judge = start_judge(provider.base_url, args.concurrency, args.processes)
        for repeat in range(1, args.repeats + 1):
            free, wall = grade(judge, rubric)
            assert free.complete, free.invalid[:3]
            calls = len(free.calls)
            ideal = calls * args.latency / args.concurrency
            total_tokens = tokens_of(free)
            ratios.append(wall / ideal)
            walls.append(wall)
            print(f"no limit, grading {repeat}: {calls} calls, {total_tokens:,} tokens, "
                  f"wall {wall:.1f} s, ideal {ideal:.1f} s, "
                  f"ratio to ideal {wall / ideal:.2f}")  # fmt: skip
    finally:
        provider.close()
    print(f"no limit: median ratio to ideal {statistics.median(ratios):.2f} "
          f"over {len(ratios)} gradings")  # fmt: skip

    limit = args.limit_share * total_tokens / (statistics.median(walls) / 60)
    for paced in (True, False):
        provider = Provider(args.latency, limit)
        try:
            extra = {"tokens_per_minute": limit} if paced else {}
            judge = start_judge(provider.base_url, args.concurrency, args.processes, **extra)
            run, wall = grade(judge, rubric)
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
