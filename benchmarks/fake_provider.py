"""The local fake model provider in a process of its own, for benchmarks.

Why a process: a judge benchmark whose client and server share one Python process measures the
GIL, not the judge. Prints its base URL on the first line, then serves until its standard input
closes. Run: python benchmarks/fake_provider.py [--latency 0.2] [--tokens-per-minute N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import scripted_answer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--tokens-per-minute", type=float, default=None)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    with FakeOpenAI(
        answer=scripted_answer,
        latency_s=args.latency,
        tokens_per_minute=args.tokens_per_minute,
        limit_window_s=args.window,
    ) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()  # until the parent closes our input
        print(f"throttled {server.throttled}", flush=True)


if __name__ == "__main__":
    main()
