"""The hub watch's rules without a hub: what counts as work, idle thresholds, outage pauses.

The same rules on a real hub, proxy and Docker workspace: tests/app/test_hub_clock.py.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from baseline.attempts import attempts, host_outage
from baseline.config import Settings
from baseline.context import Context
from baseline.hub import hub_watch
from baseline.hub_settings import hub_config
from baseline.models import (
    Attempt,
    HubLoginToken,
    PauseReason,
    Study,
    utcnow,
)
from tests.baseline.attempt_world import started_human_attempt

PS = """\
      1       0 /sbin/docker-init -- sleep infinity
      7       1 sleep infinity
     40       1 /usr/bin/python3 /usr/local/bin/jupyterhub-singleuser --X=0
     55      40 /usr/bin/python3 -m ipykernel_launcher -f /tmp/kernel.json
     61      40 /bin/bash -l
"""


def test_work_is_what_the_participant_started_not_the_servers_baseline() -> None:
    assert hub_watch.work_processes(PS) == ()
    started = PS + "     70      61 python train.py\n     80       1 sleep 300\n"
    started += "     90      55 /bin/sh -c make\n     95       0 ps -u participant\n"
    assert hub_watch.work_processes(started) == (
        "python train.py",
        "sleep 300",
        "/bin/sh -c make",
    )
    # No server at all: every process but init and the container's main one is work.
    assert hub_watch.work_processes("  1 0 init\n  7 1 sleep infinity\n  9 0 vim x\n") == ("vim x",)


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    # A hub port nothing listens on: the hub is down.
    return Settings(home=home, database_url=database_url, secret_key="s", extra={"hub_port": "9"})


def _hub_attempt(ctx: Context, tmp_path: Path, scale: float = 60.0) -> int:
    human = started_human_attempt(
        ctx, tmp_path, docker_url="unix:///nowhere.sock", time_scale=scale
    )
    assert attempts.first_login(ctx, human.attempt_id, human.user_id)
    return human.attempt_id


def _used_login(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.participant.user_id is not None
        now = utcnow()
        session.add(
            HubLoginToken(
                token_hash=f"{attempt_id:064d}",
                user_id=attempt.participant.user_id,
                attempt_id=attempt_id,
                expires_at=now,
                used_at=now,
            )
        )


def test_hub_outage_pauses_only_hub_users_and_is_not_a_host_outage(
    ctx: Context, tmp_path: Path
) -> None:
    config = hub_config(ctx.settings)
    never_used_hub = _hub_attempt(ctx, tmp_path)
    used_hub = _hub_attempt(ctx, tmp_path)
    _used_login(ctx, used_hub)
    report = hub_watch.watch_job(ctx)  # the scheduler's entry point
    assert not report.hub_up and report.outage_paused == [used_hub]
    with ctx.session() as session:
        other = session.get(Attempt, never_used_hub)
        paused = session.get(Attempt, used_hub)
        assert other is not None and paused is not None
        assert hub_watch.clock.open_pause(other) is None
        pause = hub_watch.clock.open_pause(paused)
        assert pause is not None and pause.reason is PauseReason.OUTAGE
        assert hub_watch.is_hub_outage(pause) and not host_outage.is_host_outage(pause)
        # A second round while still down opens nothing more.
        assert hub_watch.watch(session, config).outage_paused == []


def test_idle_threshold_follows_the_time_scale_and_activity_resumes(
    ctx: Context, tmp_path: Path
) -> None:
    attempt_id = _hub_attempt(ctx, tmp_path, scale=60.0)  # 1 working minute = 1 wall second
    quiet = hub_watch.Activity(last_activity=None, busy_kernels=0, work_processes=())
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.first_login_at is not None
        study = session.get(Study, attempt.study_id)
        assert study is not None
        study.idle_pause_minutes = 5.0  # five wall seconds here
        start = attempt.first_login_at
        report = hub_watch.WatchReport()
        hub_watch._idle_round(session, attempt, quiet, start + timedelta(seconds=4), report)
        assert report.idle_paused == []
        busy = hub_watch.Activity(last_activity=None, busy_kernels=1, work_processes=())
        hub_watch._idle_round(session, attempt, busy, start + timedelta(seconds=9), report)
        assert report.idle_paused == []
        hub_watch._idle_round(session, attempt, quiet, start + timedelta(seconds=6), report)
        assert report.idle_paused == [attempt_id]
        pause = hub_watch.clock.open_pause(attempt)
        assert pause is not None and pause.reason is PauseReason.IDLE
        assert pause.started_at == start + timedelta(seconds=6)  # now, never retroactive
        back = start + timedelta(seconds=20)
        seen = hub_watch.Activity(last_activity=back, busy_kernels=0, work_processes=())
        hub_watch._idle_round(session, attempt, seen, start + timedelta(seconds=25), report)
        assert report.idle_resumed == [attempt_id] and pause.ended_at == back
