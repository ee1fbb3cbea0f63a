"""`baseline serve` starts the agent worker beside the portal and restarts it when it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from baseline.config import ConfigError, load_settings
from baseline.jobs.worker_process import worker_lock, worker_managed
from tests.ports import free_port


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(c) for c in text}
    return found


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "BASELINE_HOME": str(home), **extra}
    env.pop("BASELINE_DATABASE_URL", None)
    env.pop("BASELINE_WORKER_MANAGED", None)
    env.update(extra)
    return env


def _serve(home: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    from baseline.migrate import upgrade

    upgrade(f"sqlite:///{home / 'baseline.db'}")  # in-process: spares a second interpreter
    return subprocess.Popen(
        [sys.executable, "-m", "baseline", "serve", "--no-hub", "--no-scheduler",
         "--port", str(free_port())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_serve_supervises_the_agent_worker(tmp_path: Path) -> None:
    server = _serve(tmp_path, _env(tmp_path))
    log = tmp_path / "agent-worker.log"
    try:
        driving = "agent worker: driving"
        _wait("the worker to drive", lambda: log.exists() and driving in log.read_text())
        first = _children(server.pid)
        assert len(first) == 1
        (worker,) = first
        os.kill(worker, signal.SIGKILL)
        _wait("a new worker", lambda: bool(_children(server.pid) - {worker}))
        _wait("the new worker to drive", lambda: log.read_text().count(driving) == 2)
        (restarted,) = _children(server.pid)
        assert restarted != worker
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert "agent worker running" in output
    assert "restarting" in output
    assert not Path(f"/proc/{restarted}").exists() or "Z" in _state(restarted)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, True),
        (["--no-worker"], {}, False),
        ([], {"BASELINE_WORKER_MANAGED": "false"}, False),
    ],
)
def test_serve_starts_the_worker_unless_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    args: list[str], env: dict[str, str], expected: bool,
) -> None:  # fmt: skip
    import app.server
    from baseline.cli import cli

    monkeypatch.setenv("BASELINE_HOME", str(tmp_path))
    monkeypatch.delenv("BASELINE_DATABASE_URL", raising=False)
    monkeypatch.delenv("BASELINE_WORKER_MANAGED", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, object] = {}
    monkeypatch.setattr(app.server, "run_server", lambda ctx, **kw: seen.update(kw))
    assert CliRunner().invoke(cli, ["init"]).exit_code == 0
    result = CliRunner().invoke(cli, ["serve", "--no-hub", *args])
    assert result.exit_code == 0, result.output
    assert seen["with_worker"] is expected


def test_worker_managed_setting(tmp_path: Path) -> None:
    settings = load_settings({"BASELINE_HOME": str(tmp_path)})
    assert worker_managed(settings, {}) is True
    assert worker_managed(settings, {"BASELINE_WORKER_MANAGED": "no"}) is False
    with pytest.raises(ConfigError, match="BASELINE_WORKER_MANAGED: not yes or no"):
        worker_managed(settings, {"BASELINE_WORKER_MANAGED": "maybe"})


def test_one_worker_drives_a_database_at_a_time(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'baseline.db'}")
    first, second = worker_lock(engine, tmp_path), worker_lock(engine, tmp_path)
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()
