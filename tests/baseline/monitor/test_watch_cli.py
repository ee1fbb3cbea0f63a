"""`baseline study watch`: the monitor in a terminal (one frame with --once, JSON with --json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baseline.attempts import attempts
from baseline.cli import main
from baseline.context import Context
from baseline.models import Attempt, Host, PauseReason
from tests.baseline.attempt_world import directory_resolver, make_attempt


@pytest.fixture
def cli_env(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)


@pytest.mark.sqlite_only("the terminal rendering")
def test_watch_once_prints_attempts_hosts_and_filters(
    ctx: Context, tmp_path: Path, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    running = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, running)
        assert attempt is not None
        study_name = attempt.study.name
        session.add(
            Host(name="gpu-down", docker_url="ssh://x@y", healthy=False, last_error="ssh timed out")
        )
    attempts.start(ctx, running, None, directory_resolver(tmp_path))
    attempts.pause(ctx, running, PauseReason.ADMIN, None, "maintenance")
    main(["study", "watch", study_name, "--once"])
    frame = capsys.readouterr().out
    assert f"Study {study_name}" in frame and "1 paused" in frame
    assert "paused (admin)" in frame and "agent" in frame
    assert "gpu-down" in frame and "DOWN" in frame and "ssh timed out" in frame
    main(["study", "watch", study_name, "--once", "--clock", "running"])
    assert "paused (admin)" not in capsys.readouterr().out
    main(["study", "watch", study_name, "--json"])
    body = json.loads(capsys.readouterr().out)
    assert body["attempts"][0]["pause_reason"] == "admin"


@pytest.mark.sqlite_only("the terminal rendering")
def test_watch_names_an_unknown_study(
    ctx: Context, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["study", "watch", "no-such-study", "--once"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no-such-study" in err and "Traceback" not in err
