"""The judge's model client against the local fake server: retries, fallback, tokens, prices."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import ValidationError

from scoring.llm import ChatClient, JudgeConfig, LLMError, ModelPrice, Tokenizer
from scoring.llm_transport import SHARD_THREADS, InProcessTransport
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import MESSAGES, PRICE, Answer, config, counted_answer


@pytest.mark.parametrize("kind", ["429", "500", "timeout", "malformed"])
def test_each_fault_is_retried_and_every_attempt_recorded(kind: str) -> None:
    with FakeOpenAI(
        answer=counted_answer, fault_rate=0.7, fault_kinds=(kind,), timeout_sleep_s=0.6, seed=3
    ) as server:
        client = ChatClient(config(server.base_url, timeout_s=0.3))
        for _ in range(4):
            parsed = client.parse(MESSAGES, Answer, purpose="grade")
            assert parsed.value == Answer(score=12, why="counted")
            assert parsed.calls[-1].ok and all(not c.ok for c in parsed.calls[:-1])
        assert server.faults > 0
        assert {r.fault for r in server.requests} == {kind, None}


def test_malformed_answers_cost_tokens_and_are_recorded() -> None:
    with FakeOpenAI(answer=counted_answer, fault_rate=1.0, fault_kinds=("malformed",)) as server:
        client = ChatClient(config(server.base_url, max_attempts=3))
        with pytest.raises(LLMError) as caught:
            client.parse(MESSAGES, Answer, purpose="grade")
    calls = caught.value.calls
    assert len(calls) == 3 and not any(c.ok for c in calls)
    assert all(c.prompt_tokens > 0 and c.cost_usd > 0 for c in calls)
    assert "after 3 attempts" in str(caught.value)


def test_falls_back_to_json_mode_when_json_schema_is_refused() -> None:
    with FakeOpenAI(answer=counted_answer, structured_output=False) as server:
        client = ChatClient(config(server.base_url))
        assert client.parse(MESSAGES, Answer, purpose="grade").value.score == 12
        assert client.parse(MESSAGES, Answer, purpose="grade").value.score == 12
        formats = [r.body["response_format"]["type"] for r in server.requests]
    assert formats == ["json_schema", "json_object", "json_object"]
    assert not client.uses_json_schema


def test_structured_output_is_one_call_with_the_pydantic_schema() -> None:
    with FakeOpenAI(answer=counted_answer) as server:
        client = ChatClient(config(server.base_url, reasoning_effort="high"))
        client.parse(MESSAGES, Answer, purpose="grade")
        (request,) = server.requests
    fmt = request.body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert set(fmt["json_schema"]["schema"]["properties"]) == {"score", "why"}
    assert request.body["reasoning_effort"] == "high"
    assert request.body["model"] == "fake-judge"


def test_check_rejections_are_retried() -> None:
    seen: list[int] = []

    def check(answer: Answer) -> str | None:
        seen.append(answer.score)
        return "first answer refused" if len(seen) == 1 else None

    with FakeOpenAI(answer=counted_answer) as server:
        parsed = ChatClient(config(server.base_url)).parse(
            MESSAGES, Answer, purpose="rank", check=check
        )
    assert len(parsed.calls) == 2 and "refused" in (parsed.calls[0].error or "")


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    cfg = JudgeConfig(
        base_url="http://127.0.0.1:9/v1",
        model="o3-mini",
        backoff_initial_s=1.0,
        backoff_max_s=10.0,
    )
    client = ChatClient(cfg)
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (5, 10.0)]:
        delays = [client.backoff(attempt) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jitter


def test_unknown_model_needs_a_price_and_costs_are_computed() -> None:
    with pytest.raises(ValidationError, match="no price known for model 'my-llama'"):
        JudgeConfig(base_url="http://x/v1", model="my-llama")
    free = JudgeConfig(
        base_url="http://x/v1",
        model="my-llama",
        price=ModelPrice(input_usd_per_mtok=0, output_usd_per_mtok=0),
    )
    assert free.resolved_price.cost(10**6, 10**6) == 0
    assert JudgeConfig(base_url="http://x/v1", model="o3-mini").resolved_price.cost(
        1_000_000, 1_000_000
    ) == pytest.approx(1.10 + 4.40)
    assert PRICE.cost(2_000_000, 500_000) == pytest.approx(2.0 + 2.0)


def test_settings_digest_ignores_transport_but_not_the_model() -> None:
    base = config("http://127.0.0.1:1/v1")
    assert (
        base.settings_digest()
        == base.model_copy(
            update={"concurrency": 3, "base_url": "http://other/v1", "max_attempts": 2}
        ).settings_digest()
    )
    assert base.settings_digest() != base.model_copy(update={"model": "o1"}).settings_digest()
    assert (
        base.settings_digest()
        != base.model_copy(update={"reasoning_effort": "low"}).settings_digest()
    )


def test_tokenizer_is_a_real_bpe_offline() -> None:
    tok = Tokenizer("o200k_base")
    assert tok.count("hello world") == 2
    assert tok.count("") == 0
    text = "The quick brown fox jumps over the lazy dog. " * 100
    assert tok.count(tok.head(text, 50)) <= 50
    assert tok.count(tok.tail(text, 50)) <= 50
    assert text.startswith(tok.head(text, 50))


def test_concurrent_calls_spread_over_the_transport_shards_and_close_closes_them_all() -> None:
    """Each worker thread keeps one shard, threads are dealt evenly, and close reaches every
    shard's connection pool."""
    workers = 2 * SHARD_THREADS
    with FakeOpenAI(answer=counted_answer, latency_s=0.02) as server:
        client = ChatClient(config(server.base_url, concurrency=workers))
        assert isinstance(client.transport, InProcessTransport)  # 20 in flight: one process
        shards = client.transport.shards
        assert len(shards) == 2
        threads_of: dict[int, set[int]] = {id(shard): set() for shard in shards}
        lock = threading.Lock()
        for shard in shards:

            def counting(
                *args: Any, _post: Any = shard.post, _key: int = id(shard), **kwargs: Any
            ) -> Any:
                with lock:
                    threads_of[_key].add(threading.get_ident())
                return _post(*args, **kwargs)

            shard.post = counting  # type: ignore[method-assign]
        everyone = threading.Barrier(workers)

        def call(_: int) -> int:
            everyone.wait(timeout=10)  # every worker thread makes a call
            return client.parse(MESSAGES, Answer, purpose="grade").value.score

        with ThreadPoolExecutor(max_workers=workers) as pool:
            assert list(pool.map(call, range(workers))) == [12] * workers
        assert server.calls == workers
        client.close()
    assert [len(threads) for threads in threads_of.values()] == [SHARD_THREADS, SHARD_THREADS]
    assert all(shard.is_closed() for shard in shards)
