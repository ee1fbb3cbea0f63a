"""One scheduler leader among several portal processes, chosen through the database.

Two or more `baseline serve` processes may share one database (for availability, or behind a
load balancer). Each of them serves pages, but only one may run the background scheduler:
otherwise a checkpoint would be taken twice, a snapshot graded twice, an attempt launched twice.

The leader is whoever holds a lock that dies with its process, so no lease needs renewing and a
crashed leader can never keep the lock:

- on PostgreSQL, a session-level advisory lock (`pg_try_advisory_lock`) on a connection kept
  open for that purpose only; the server releases it the moment the connection drops;
- on SQLite (the single-machine default), an exclusive `flock` on a file beside the database:
  the kernel releases it when the process dies.

Standby processes try to take the lock every `poll_s` seconds, so a dead leader is replaced
within about that bound; the new leader starts its scheduler, which catches up every point that
fell due meanwhile exactly as after a restart. A leader that loses its lock (its database
connection broke) stops its scheduler at once and stands by again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

# An arbitrary constant that names "the Baseline scheduler" among advisory locks (bigint).
ADVISORY_LOCK_KEY = 0x42A5E11E
POLL_S = 2.0


class LeaderLock(Protocol):
    """A lock that at most one process holds and that dies with its holder."""

    def try_acquire(self) -> bool:
        """Take the lock without waiting; True when this process now holds it."""
        ...

    def still_held(self) -> bool:
        """Whether this process still holds the lock (False once its means of holding broke)."""
        ...

    def release(self) -> None: ...


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock on a dedicated connection."""

    def __init__(self, engine: Engine, key: int = ADVISORY_LOCK_KEY) -> None:
        self.engine = engine
        self.key = key
        self._connection: Connection | None = None

    def try_acquire(self) -> bool:
        if self._connection is not None:
            return True
        connection = self.engine.connect()
        try:
            taken = bool(
                connection.execute(
                    text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}
                ).scalar_one()
            )
            connection.commit()
        except Exception:
            connection.close()
            raise
        if not taken:
            connection.close()
            return False
        self._connection = connection
        return True

    def still_held(self) -> bool:
        if self._connection is None:
            return False
        try:
            self._connection.execute(text("SELECT 1")).scalar_one()
            self._connection.commit()
        except Exception:
            # The connection broke: the server has released the lock (or will, once it notices).
            with contextlib.suppress(Exception):
                self._connection.invalidate()
            self._connection = None
            return False
        return True

    def release(self) -> None:
        if self._connection is None:
            return
        with contextlib.suppress(Exception):
            self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
            self._connection.commit()
        with contextlib.suppress(Exception):
            self._connection.close()
        self._connection = None


class FileLock:
    """An exclusive `flock` on a file; the kernel drops it when the holding process dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def still_held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def lock_for(engine: Engine, home: Path) -> LeaderLock:
    """The leader lock that fits the database: advisory on PostgreSQL, a file lock on SQLite."""
    url = make_url(str(engine.url))
    if url.get_backend_name() == "postgresql":
        return AdvisoryLock(engine)
    database = url.database or ""
    beside = Path(database).parent if database and database != ":memory:" else home
    return FileLock(beside / "scheduler.leader.lock")


Running = TypeVar("Running")


class LeaderElection(Generic[Running]):
    """Run `start()` while this process leads, `stop(running)` when it stops leading.

    `start` is called in the election thread; it must return once the work is running (the
    snapshot scheduler runs in its own threads).
    """

    def __init__(
        self,
        lock: LeaderLock,
        start: Callable[[], Running],
        stop: Callable[[Running], None],
        poll_s: float = POLL_S,
    ) -> None:
        self.lock = lock
        self._start = start
        self._stop = stop
        self.poll_s = poll_s
        self._running: Running | None = None
        self._leading = False
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="leader-election", daemon=True)
        self.became_leader = threading.Event()

    @property
    def leading(self) -> bool:
        return self._leading

    def begin(self) -> None:
        """Try once at once (so a lone process leads before it serves), then keep trying."""
        self._step()
        self._thread.start()

    def _step(self) -> None:
        if not self._leading:
            try:
                acquired = self.lock.try_acquire()
            except Exception:
                log.warning("leader election: the database did not answer; standing by")
                return
            if acquired:
                log.info("this process now runs the scheduler (leader)")
                try:
                    self._running = self._start()
                except Exception:
                    log.exception("the scheduler failed to start; giving up the lead")
                    self.lock.release()
                    return
                self._leading = True
                self.became_leader.set()
            return
        if not self.lock.still_held():
            log.warning("lost the scheduler lead (database connection broke); standing by")
            self._step_down()

    def _step_down(self) -> None:
        running, self._running = self._running, None
        self._leading = False
        self.became_leader.clear()
        if running is not None:
            try:
                self._stop(running)
            except Exception:
                log.exception("stopping the scheduler failed")

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_s):
            self._step()

    def end(self) -> None:
        """Stop trying; stop the scheduler if this process leads, and let the lock go."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.poll_s + 5)
        if self._leading:
            self._step_down()
        self.lock.release()
