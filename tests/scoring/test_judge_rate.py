"""The judge against a provider that enforces a tokens-per-minute limit (429 with retry-after).

Without pacing the judge meets a storm of 429s and still finishes with every leaf valid; told
the limit, it paces itself and the provider throttles nothing, grading the same leaves the same.
"""

from __future__ import annotations

import time

from scoring.judge import Judge, JudgeRun
from scoring.rubric import Rubric
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import config, materials, scripted_answer, synthetic_submission
from tests.scoring.rubric_factory import leaf, node

LEAVES = 40


def _rubric() -> Rubric:
    categories = ("Code Development", "Code Execution")
    return Rubric.from_obj(node("root", *(leaf(f"l{i}", categories[i % 2]) for i in range(LEAVES))))


def _grade(server: FakeOpenAI, **limits: float) -> tuple[JudgeRun, float]:
    cfg = config(
        server.base_url,
        concurrency=32,
        max_attempts=100,
        backoff_initial_s=0.01,
        backoff_max_s=0.2,
        file_token_budget=None,
        **limits,
    )
    started = time.monotonic()
    run = Judge(cfg).grade(_rubric(), materials(), synthetic_submission())
    return run, time.monotonic() - started


def test_a_429_storm_slows_the_judge_without_invalid_leaves() -> None:
    with FakeOpenAI(answer=scripted_answer) as free_server:
        free, _ = _grade(free_server)
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in free.calls if c.ok)
    assert free.complete
    # A limit that lets the whole grading through in about 6 s, enforced over 2 s windows.
    limit = tokens / 0.1
    with FakeOpenAI(answer=scripted_answer, tokens_per_minute=limit, limit_window_s=2.0) as server:
        stormed, stormed_s = _grade(server)
        throttled = server.throttled
    assert throttled > 0  # the storm happened
    assert stormed.complete and not stormed.invalid  # and cost no leaf
    assert stormed_s > 3.0  # the limit, not the client, set the pace
    assert {p: r.score for p, r in stormed.results.items()} == {
        p: r.score for p, r in free.results.items()
    }

    with FakeOpenAI(answer=scripted_answer, tokens_per_minute=limit, limit_window_s=2.0) as server:
        paced, _ = _grade(server, tokens_per_minute=limit)
        paced_throttled = server.throttled
    assert paced.complete and not paced.invalid
    assert paced_throttled < throttled / 5  # pacing avoids the storm (a first burst may remain)
