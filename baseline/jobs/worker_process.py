"""The agent worker beside the portal: `baseline serve` starts it and restarts it if it dies.

Agent attempts are driven by `baseline agent worker` (`baseline.runs.agent_worker.Worker`). Run as a
child process of the portal, not as threads in it: a worker crash, a stuck model call or a
memory leak of a 48-hour run cannot take the portal down, and killing the worker (SIGKILL
included) is survivable by design, since a restarted worker resumes every unfinished run from its
transcript. `WorkerSupervisor` restarts it after a short, growing back-off, as the hub's
supervisor does.

Several `serve` processes may share one database; each starts a worker, but a worker drives
attempts only while it holds the worker lock (`worker_lock`), so exactly one drives at a time
and a standby takes over when the holder dies. `worker_managed` (setting ``worker_managed`` or
``BASELINE_WORKER_MANAGED``, default true) turns the child off, for a worker run elsewhere.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from baseline.config import Settings, yes_or_no
from baseline.jobs.leadership import AdvisoryLock, FileLock, LeaderLock
from infra.supervision import RestartingChild

log = logging.getLogger(__name__)

# Names "the Baseline agent worker" among advisory locks; distinct from the scheduler's.
WORKER_LOCK_KEY = 0x42A5E11F
ENV = "BASELINE_WORKER_MANAGED"


def worker_managed(settings: Settings, environ: dict[str, str] | None = None) -> bool:
    env = dict(os.environ if environ is None else environ)
    raw = env.get(ENV)
    if raw is None:
        value = settings.extra.get("worker_managed")
        raw = "true" if value is None else str(value)
    return yes_or_no(ENV, raw)


def worker_lock(engine: Engine, home: Path) -> LeaderLock:
    """At most one driving worker per database: advisory on PostgreSQL, a file lock on SQLite."""
    url = make_url(str(engine.url))
    if url.get_backend_name() == "postgresql":
        return AdvisoryLock(engine, key=WORKER_LOCK_KEY)
    database = url.database or ""
    beside = Path(database).parent if database and database != ":memory:" else home
    return FileLock(beside / "agent-worker.lock")


def worker_command() -> list[str]:
    return [sys.executable, "-m", "baseline", "agent", "worker"]


class WorkerSupervisor(RestartingChild):
    """Keeps one worker child running; `stop` ends it (TERM, then KILL)."""

    label = "agent worker"

    def __init__(self, log_file: Path, command: Sequence[str] | None = None) -> None:
        self.log_file = log_file
        self.command = list(command or worker_command())
        super().__init__()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            # Its own session: a Ctrl-C aimed at the portal's terminal is handled by `stop`.
            proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        log.info("agent worker started (pid %s), log %s", proc.pid, self.log_file)
        return proc
