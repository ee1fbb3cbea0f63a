"""The judge's HTTP transport: SDK clients in shards, each worker thread bound to one.

Why shards: one SDK client has one connection pool, and its pool scans all its connections at
every request start and every response close (httpcore's ``_assign_requests_to_connections``).
With a hundred calls in flight that scan was about a third of the judge's CPU in a full grading
(measured with yappi on PaperBench's pinn rubric); shards of a few connections each make every
scan short. A client per thread was slower again (each client's own pool, headers and SSL
context), so threads share a shard of ``SHARD_THREADS``. All shards use one SSL context: building
one costs milliseconds of CPU and memory for its certificate store.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

    from openai import OpenAI

# Threads per shard. Alternating runs of bench_judge_rate (concurrency 100) could not tell 5, 10
# and 20 apart on a busy 2-core machine; all beat one pool of 100 connections.
SHARD_THREADS = 10


def shard_count(concurrency: int) -> int:
    return max(1, -(-concurrency // SHARD_THREADS))


class ShardedClients:
    """``count`` SDK clients made by `make`; each calling thread keeps the one it got first.

    Threads are dealt round-robin, so a thread pool of ``count x SHARD_THREADS`` workers puts
    ``SHARD_THREADS`` threads on each shard."""

    def __init__(self, make: Callable[[ssl.SSLContext], OpenAI], count: int) -> None:
        import httpx2

        # The context the SDK's own client would build (it honours SSL_CERT_FILE / SSL_CERT_DIR).
        context = httpx2.create_ssl_context()
        self.shards: list[OpenAI] = [make(context) for _ in range(count)]
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
