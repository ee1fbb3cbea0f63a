"""The judge's HTTP transport: one call's exchange with the endpoint, in this process or another.

A call's outcome is a `Reply` (status, headers, body, or why no response came back), a plain
value that can cross a process boundary, so the judge's retry, pacing and parsing logic
(`scoring.llm.ChatClient`) is the same whichever transport made the call.

In this process (`InProcessTransport`): SDK clients in shards, each calling thread bound to one.
Why shards: one SDK client has one connection pool, and its pool scans all its connections at
every request start and every response close (httpcore's ``_assign_requests_to_connections``).
With a hundred calls in flight that scan was about a third of the judge's CPU in a full grading
(measured with yappi on PaperBench's pinn rubric); shards of a few connections each make every
scan short. A client per thread was slower again (each client's own pool, headers and SSL
context), so threads share a shard of ``SHARD_THREADS``. All shards use one SSL context: building
one costs milliseconds of CPU and memory for its certificate store.

In worker processes (`scoring.llm_workers`): when many calls are in flight, the SDK's own CPU
(about 1.5 ms a call to build the request, send it and read the answer) is more than the one core
a Python process can use at a time; `judge_processes` says how many processes a judge spreads its
calls over.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import ssl

    from openai import OpenAI

# Threads per shard. Alternating runs of bench_judge_rate (concurrency 100) could not tell 5, 10
# and 20 apart on a busy 2-core machine; all beat one pool of 100 connections.
SHARD_THREADS = 10

# Calls in flight per process. At a fast provider's 0.2 s latency, 50 calls in flight are 250
# calls a second, about half a core of SDK work; a second process pays off from there. With
# real judging latencies (seconds per call) one process is never the bottleneck.
CALLS_PER_PROCESS = 50


def shard_count(concurrency: int) -> int:
    return max(1, -(-concurrency // SHARD_THREADS))


def judge_processes(concurrency: int, cpus: int | None = None) -> int:
    """Processes that make a judge's calls: one per ``CALLS_PER_PROCESS`` calls in flight, at
    most one per CPU this process may run on; 1 means the calls are made in the judge's own
    process."""
    available = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return max(1, min(available, concurrency // CALLS_PER_PROCESS))


@dataclass(frozen=True)
class ClientSettings:
    """What an SDK client for the judge is made from (also sent to worker processes)."""

    base_url: str
    api_key: str = field(repr=False)
    timeout_s: float

    def make(self, context: ssl.SSLContext) -> OpenAI:
        """An SDK client without the SDK's own retries (`ChatClient` retries, and records every
        attempt), on a shared SSL context."""
        from openai import DefaultHttpxClient, OpenAI

        return OpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            max_retries=0,
            timeout=self.timeout_s,
            http_client=DefaultHttpxClient(verify=context),
        )


@dataclass(frozen=True)
class Reply:
    """One call's outcome. ``failure`` is None for a successful (2xx) answer, else why it failed,
    as the judge records it; ``status`` is 0 when no HTTP response came back."""

    status: int
    headers: dict[str, str]
    content: bytes
    failure: str | None = None

    @classmethod
    def no_response(cls, why: str) -> Reply:
        return cls(status=0, headers={}, content=b"", failure=why)


def exchange(client: OpenAI, body: dict[str, Any]) -> Reply:
    """POST one chat completion request through the SDK; every HTTP or connection failure is a
    `Reply`, not an exception."""
    import httpx2
    import openai

    try:
        response = client.post("/chat/completions", body=body, cast_to=httpx2.Response)
    except openai.APIStatusError as exc:
        failure = f"HTTP {exc.status_code}: {exc.message}"[:500]
        return Reply(exc.status_code, dict(exc.response.headers), b"", failure)
    except openai.APITimeoutError:
        return Reply.no_response("timed out")
    except openai.APIConnectionError as exc:
        return Reply.no_response(f"{type(exc).__name__}: {exc}"[:500])
    return Reply(response.status_code, dict(response.headers), response.content)


class Transport(Protocol):
    """Makes one call at a time per calling thread; safe to call from many threads."""

    def post(self, body: dict[str, Any]) -> Reply: ...

    def close(self) -> None: ...


class ShardedClients:
    """``count`` SDK clients made by `settings`; each calling thread keeps the one it got first.

    Threads are dealt round-robin, so a thread pool of ``count x SHARD_THREADS`` workers puts
    ``SHARD_THREADS`` threads on each shard."""

    def __init__(self, settings: ClientSettings, count: int) -> None:
        import httpx2

        # The context the SDK's own client would build (it honours SSL_CERT_FILE / SSL_CERT_DIR).
        context = httpx2.create_ssl_context()
        self.shards: list[OpenAI] = [settings.make(context) for _ in range(count)]
        self._next = itertools.count()
        self._local = threading.local()

    def client(self) -> OpenAI:
        """The calling thread's client."""
        try:
            client: OpenAI = self._local.client
        except AttributeError:
            client = self._local.client = self.shards[next(self._next) % len(self.shards)]
        return client

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


class InProcessTransport:
    """Calls made by the calling threads themselves."""

    def __init__(self, settings: ClientSettings, concurrency: int) -> None:
        self.clients = ShardedClients(settings, shard_count(concurrency))

    @property
    def shards(self) -> list[OpenAI]:
        return self.clients.shards

    def post(self, body: dict[str, Any]) -> Reply:
        return exchange(self.clients.client(), body)

    def close(self) -> None:
        self.clients.close()
