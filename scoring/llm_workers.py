"""The judge's calls spread over worker processes, for when one process's CPU cannot keep up.

Each worker is a child Python process (``python -m scoring.llm_workers FD``) with its own SDK
clients (`InProcessTransport`). Each of the judge's calling threads has a connection of its own
to one worker (a socket pair whose other end is passed to the worker over its control socket),
served there by a thread of its own: a call is the request body one way and its `Reply` the
other. Everything else (retries, pacing against the provider's limits, parsing, records) stays
in the judge's process, so one rate limiter sees every call whichever process makes it.

Workers are started once per process and endpoint (`pool_for`) and reused by every grading:
starting one costs about a second (it imports the SDK), which a grading must not pay. A worker
that dies is replaced at the next call; the calls it had in flight come back as connection
failures, which the judge retries. A worker exits when the judge's process closes its control
socket, including when that process dies, so none outlives it.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from scoring.llm_transport import ClientSettings, InProcessTransport, Reply

# The folder that holds the `scoring` package, put on a worker's import path (the judge's
# process may have found the package through its working directory or PYTHONPATH).
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)

WORKER_ENDED = "APIConnectionError: the judge's worker process ended"

# How long a new worker may take to be ready (importing the SDK takes about a second here).
START_TIMEOUT_S = 60.0


class WorkerStartError(RuntimeError):
    """A worker process that did not come up."""


class Worker:
    """One worker process. Each calling thread gets a connection of its own to it (`connect`),
    served by a thread of its own there: a call is one message each way, with no thread in
    between to hand it over (a first version queued calls to a reader thread and a thread pool
    on each side; every hand-over waited for a busy process's interpreter lock, and calls took
    about 5 ms longer).

    `calls_in_flight` is how many calls the worker is expected to carry at once (it sizes its
    SDK client shards)."""

    def __init__(self, settings: ClientSettings, calls_in_flight: int) -> None:
        control, theirs = socket.socketpair()
        # The key travels over the socket, never in the command line or the environment
        # (where the judge's own process may have found it).
        env = {name: value for name, value in os.environ.items() if value != settings.api_key}
        env["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "scoring.llm_workers", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self._control = control
        self._lock = threading.Lock()
        self._setup = (settings, calls_in_flight)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Hand the worker its settings and wait until it has its SDK clients;
        `WorkerStartError` if it does not."""
        with Connection(os.dup(self._control.fileno())) as setup:
            try:
                setup.send(self._setup)
                if setup.poll(timeout_s) and setup.recv() == "ready":
                    return
            except (EOFError, OSError):
                pass
        status = self.process.poll()
        self.close()
        why = f"within {timeout_s:g} s" if status is None else f"(exit status {status})"
        raise WorkerStartError(
            f"the judge's worker process did not start {why}; its error, if any, is on the "
            "portal's standard error"
        )

    @property
    def ended(self) -> bool:
        return self.process.poll() is not None

    def connect(self) -> Connection:
        """A new connection to the worker, for one calling thread."""
        ours, theirs = socket.socketpair()
        with theirs, self._lock:
            socket.send_fds(self._control, [b"c"], [theirs.fileno()])
        return Connection(ours.detach())

    def close(self) -> None:
        """Stop the worker (calls in flight on it come back as failures) and wait for it."""
        with contextlib.suppress(OSError):  # the worker is gone already
            self._control.shutdown(socket.SHUT_RDWR)
        self._control.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class WorkerPool:
    """``processes`` workers; each calling thread keeps the worker it got first, and threads
    are dealt round-robin, so a grading's thread pool is spread evenly."""

    def __init__(self, settings: ClientSettings, processes: int, concurrency: int) -> None:
        self._settings = settings
        self._calls_per_worker = max(1, -(-concurrency // processes))
        self._lock = threading.Lock()
        self.workers = [Worker(settings, self._calls_per_worker) for _ in range(processes)]
        try:
            for worker in self.workers:
                worker.wait_ready()
        except WorkerStartError:
            self.shut_down()
            raise
        self._next = itertools.count()
        self._local = threading.local()

    def post(self, body: dict[str, Any]) -> Reply:
        connection = self._connection()
        if connection is None:
            return Reply.no_response(WORKER_ENDED)
        try:
            connection.send(body)
            reply: Reply = connection.recv()
        except (EOFError, OSError):
            # The worker died, or is being replaced: the next call connects afresh.
            del self._local.connection
            connection.close()
            return Reply.no_response(WORKER_ENDED)
        return reply

    def _connection(self) -> Connection | None:
        """The calling thread's connection (closed with the thread's locals when it ends)."""
        try:
            connection: Connection = self._local.connection
        except AttributeError:
            pass
        else:
            return connection
        try:
            slot: int = self._local.slot
        except AttributeError:
            slot = self._local.slot = next(self._next) % len(self.workers)
        try:
            connection = self._local.connection = self._worker(slot).connect()
        except (OSError, WorkerStartError):
            return None  # the call fails as a connection failure, which the judge retries
        return connection

    def _worker(self, slot: int) -> Worker:
        """The worker in `slot`, replaced first if it has ended."""
        with self._lock:
            worker = self.workers[slot]
            if worker.ended:
                worker.close()
                worker = Worker(self._settings, self._calls_per_worker)
                worker.wait_ready()
                self.workers[slot] = worker
            return worker

    def close(self) -> None:
        """Pools are shared by every judge of the process (`pool_for`) and closed at its exit."""

    def shut_down(self) -> None:
        for worker in self.workers:
            worker.close()


_pools: dict[tuple[ClientSettings, int, int], WorkerPool] = {}
_pools_lock = threading.Lock()


def pool_for(settings: ClientSettings, processes: int, concurrency: int) -> WorkerPool:
    """The process's pool for this endpoint and shape, started at its first use."""
    key = (settings, processes, concurrency)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = WorkerPool(settings, processes, concurrency)
        return pool


@atexit.register
def shut_down_pools() -> None:
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.shut_down()


def serve(control: socket.socket) -> None:
    """A worker's life: serve each connection it is handed on a thread of its own, and stop
    when the judge's process closes the control socket (or dies)."""
    # Ctrl-C at a terminal reaches the whole process group: the judge's process decides, and
    # this worker ends when that process closes the control socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import openai  # noqa: F401  (the slow part of starting: done before waiting for settings)

    with Connection(os.dup(control.fileno())) as setup:
        settings, calls_in_flight = setup.recv()
        transport = InProcessTransport(settings, calls_in_flight)
        setup.send("ready")

    def answer(connection: Connection) -> None:
        with connection:
            while True:
                try:
                    body = connection.recv()
                except (EOFError, OSError):
                    return  # the calling thread ended
                try:
                    reply = transport.post(body)
                except Exception as exc:  # a bug must reach the judge's records, not end this
                    traceback.print_exc()
                    why = f"{type(exc).__name__} in the judge's worker process: {exc}"
                    reply = Reply.no_response(why[:500])
                try:
                    connection.send(reply)
                except OSError:
                    return

    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            break
        if not message:
            break
        for fd in fds:
            threading.Thread(target=answer, args=(Connection(fd),), daemon=True).start()
    # Calls still in flight have nobody to answer to; do not wait for their timeouts.
    os._exit(0)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
