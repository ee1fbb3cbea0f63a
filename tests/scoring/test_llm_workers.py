"""The judge's calls made in worker processes: same outcomes, one rate limiter, no orphans.

Each test starts real worker processes (``python -m scoring.llm_workers``) against the local fake
provider, and shuts them down afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import scoring.llm_workers as llm_workers
from scoring.judge import Judge, JudgeRun
from scoring.llm import ChatClient, LLMError
from scoring.llm_transport import judge_processes
from scoring.llm_workers import WORKER_ENDED, WorkerPool, WorkerStartError
from scoring.rubric import Rubric
from tests.docker_env import process_alive
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import (
    MESSAGES,
    Answer,
    config,
    counted_answer,
    materials,
    scripted_answer,
    synthetic_submission,
)
from tests.scoring.rubric_factory import leaf, node

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_pool_left() -> Iterator[None]:
    yield
    llm_workers.shut_down_pools()


def _pool(client: ChatClient) -> WorkerPool:
    assert isinstance(client.transport, WorkerPool)
    return client.transport


def _sockets_to(port: int, pid: int) -> int:
    """Established TCP connections of process `pid` to 127.0.0.1:`port`."""
    inodes: set[str] = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and remote == f"0100007F:{port:04X}":
            inodes.add(inode)
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            count += 1
    return count


def test_processes_follow_the_calls_in_flight_up_to_one_per_cpu() -> None:
    assert judge_processes(32, cpus=2) == 1  # the portal's default: no worker processes
    assert judge_processes(64, cpus=2) == 1
    assert judge_processes(100, cpus=2) == 2
    assert judge_processes(1_000, cpus=2) == 2
    assert judge_processes(400, cpus=16) == 8
    assert judge_processes(10, cpus=1) == 1


@pytest.mark.parametrize("kind", ["429", "500", "timeout", "malformed"])
def test_each_fault_is_retried_and_recorded_as_in_one_process(kind: str) -> None:
    with FakeOpenAI(
        answer=counted_answer, fault_rate=0.7, fault_kinds=(kind,), timeout_sleep_s=0.6, seed=3
    ) as server:
        client = ChatClient(config(server.base_url, timeout_s=0.3), processes=2)
        for _ in range(4):
            parsed = client.parse(MESSAGES, Answer, purpose="grade")
            assert parsed.value == Answer(score=12, why="counted")
            assert parsed.calls[-1].ok and all(not c.ok for c in parsed.calls[:-1])
            expected = {"429": "HTTP 429", "500": "HTTP 500", "timeout": "timed out"}.get(kind)
            if expected is not None:
                assert all((c.error or "").startswith(expected) for c in parsed.calls[:-1])
        assert server.faults > 0


def test_the_workers_make_the_calls_and_never_hold_the_key_in_argv_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = "sk-test-worker-secret-123"
    monkeypatch.setenv("JUDGE_TEST_KEY", key)
    with FakeOpenAI(answer=counted_answer, latency_s=0.3) as server:
        client = ChatClient(config(server.base_url, api_key_env="JUDGE_TEST_KEY"), processes=2)
        pool = _pool(client)
        port = int(server.base_url.split(":")[2].split("/")[0])
        with ThreadPoolExecutor(max_workers=8) as threads:
            calls = [
                threads.submit(client.parse, MESSAGES, Answer, purpose="grade") for _ in range(8)
            ]
            assert all(call.result().value.score == 12 for call in calls)
        # Eight calls at once needed eight connections; they stay open (keep-alive).
        in_workers = [_sockets_to(port, w.process.pid) for w in pool.workers]
        in_judge = _sockets_to(port, os.getpid())
        assert set(server.authorizations) == {f"Bearer {key}"}
    assert in_judge == 0
    assert all(count > 0 for count in in_workers) and sum(in_workers) >= 8
    for worker in pool.workers:
        assert key.encode() not in Path(f"/proc/{worker.process.pid}/cmdline").read_bytes()
        assert key.encode() not in Path(f"/proc/{worker.process.pid}/environ").read_bytes()


def test_a_killed_worker_is_replaced_and_its_calls_retried() -> None:
    with FakeOpenAI(answer=counted_answer, latency_s=0.4) as server:
        client = ChatClient(config(server.base_url, concurrency=8), processes=2)
        pool = _pool(client)
        victim = pool.workers[0].process.pid
        start = threading.Barrier(9)

        def call(_: int) -> Any:
            start.wait(timeout=10)
            return client.parse(MESSAGES, Answer, purpose="grade")

        with ThreadPoolExecutor(max_workers=8) as threads:
            calls = [threads.submit(call, i) for i in range(8)]
            start.wait(timeout=10)
            time.sleep(0.2)  # the calls are in flight on both workers
            os.kill(victim, signal.SIGKILL)
            results = [c.result() for c in calls]
    assert all(r.value.score == 12 for r in results)
    failed = [c for r in results for c in r.calls if not c.ok]
    assert failed and all(c.error == WORKER_ENDED for c in failed)
    # The four calls the victim had failed (a retry may fail again, reaching the dead worker
    # before its end is noticed); the other worker's four were untouched.
    assert sum(1 for r in results if any(not c.ok for c in r.calls)) == 4
    assert pool.workers[0].process.pid != victim and not pool.workers[0].ended
    assert not process_alive(victim)


def test_paced_calls_over_two_processes_share_one_rate_limit() -> None:
    """The provider enforces a token limit; the judge, told it, paces the calls of both worker
    processes together (each process pacing alone would send twice the limit)."""
    rubric = Rubric.from_obj(node("root", *(leaf(f"l{i}", "Code Development") for i in range(40))))

    def grade(server: FakeOpenAI, **limits: float) -> tuple[JudgeRun, float, int]:
        cfg = config(
            server.base_url,
            concurrency=16,
            file_token_budget=None,
            max_attempts=100,
            backoff_initial_s=0.01,
            backoff_max_s=0.2,
            **limits,
        )
        judge = Judge(cfg, client=ChatClient(cfg, processes=2))
        started = time.monotonic()
        run = judge.grade(rubric, materials(), synthetic_submission())
        return run, time.monotonic() - started, server.throttled

    with FakeOpenAI(answer=scripted_answer) as server:
        free, _, _ = grade(server)
    tokens = sum(c.prompt_tokens + c.completion_tokens for c in free.calls if c.ok)
    limit = tokens / 0.05  # the whole grading in about 3 s, enforced over 1 s windows
    with FakeOpenAI(answer=scripted_answer, tokens_per_minute=limit, limit_window_s=1.0) as server:
        stormed, _, storm = grade(server)
    with FakeOpenAI(answer=scripted_answer, tokens_per_minute=limit, limit_window_s=1.0) as server:
        paced, took, throttled = grade(server, tokens_per_minute=limit)
    assert stormed.complete and paced.complete and not paced.invalid
    assert storm > 0  # without pacing, the two processes together overran the limit
    assert took > 2.0  # the limit set the pace
    assert throttled < storm / 5  # pacing avoids the storm (a first burst may remain)


def test_the_workers_end_when_the_judge_process_dies() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from scoring.llm import ChatClient
        from tests.scoring.judge_support import config
        client = ChatClient(config("http://127.0.0.1:9/v1"), processes=2)
        print(" ".join(str(w.process.pid) for w in client.transport.workers), flush=True)
        time.sleep(60)
        """
    )
    judge = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert judge.stdout is not None
    pids = [int(pid) for pid in judge.stdout.readline().split()]
    assert len(pids) == 2 and all(process_alive(pid) for pid in pids)
    judge.kill()
    judge.wait()
    deadline = time.monotonic() + 10
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process_alive(pid) for pid in pids)


def test_shutting_the_pools_down_stops_their_workers() -> None:
    with FakeOpenAI(answer=counted_answer) as server:
        client = ChatClient(config(server.base_url), processes=2)
        assert client.parse(MESSAGES, Answer, purpose="grade").value.score == 12
        workers = list(_pool(client).workers)
        llm_workers.shut_down_pools()
    assert all(worker.process.returncode is not None for worker in workers)
    # A new client for the same endpoint starts a new pool.
    with FakeOpenAI(answer=counted_answer) as server:
        again = ChatClient(config(server.base_url), processes=2)
        assert again.parse(MESSAGES, Answer, purpose="grade").value.score == 12


def test_a_worker_that_cannot_start_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_workers.sys, "executable", "/bin/false")
    with pytest.raises(WorkerStartError, match="did not start"):
        ChatClient(config("http://127.0.0.1:9/v1"), processes=2)


def test_an_error_inside_a_worker_reaches_the_records_and_keeps_its_connection() -> None:
    """A call the SDK cannot even build (a body it cannot encode) fails with the worker's error,
    not as a vanished worker, and the same thread's next call still works."""
    with FakeOpenAI(answer=counted_answer) as server:
        client = ChatClient(config(server.base_url, max_attempts=2), processes=2)
        unencodable: Any = [{"role": "user", "content": {"a set"}}]
        with pytest.raises(LLMError) as caught:
            client.parse(unencodable, Answer, purpose="grade")
        assert len(caught.value.calls) == 2
        assert all(
            (c.error or "").startswith("TypeError in the judge's worker process")
            for c in caught.value.calls
        )
        assert client.parse(MESSAGES, Answer, purpose="grade").value.score == 12
        assert not any(worker.ended for worker in _pool(client).workers)


def test_ctrl_c_is_left_to_the_judge_process() -> None:
    """A terminal's Ctrl-C reaches the whole process group; a worker leaves the decision to the
    judge's process (it ends when that process does)."""
    with FakeOpenAI(answer=counted_answer) as server:
        client = ChatClient(config(server.base_url), processes=2)
        for worker in _pool(client).workers:
            os.kill(worker.process.pid, signal.SIGINT)
        time.sleep(0.5)
        assert not any(worker.ended for worker in _pool(client).workers)
        assert client.parse(MESSAGES, Answer, purpose="grade").value.score == 12
