"""Exactly one driver per agent attempt (issue 36 item 1): the lease in the database.

The README's `baseline attempt launch ID && baseline agent run ID` beside `serve`'s worker drove
one attempt twice. Here a second driver (the CLI's `agent run`, or the worker) refuses while the
lease is held, naming its holder; a live holder keeps it by renewing; a dead holder's lease
expires and the next driver takes it; a holder whose lease was taken stops.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from datetime import timedelta
from unittest import mock

import pytest

from baseline.cli import main
from baseline.context import Context
from baseline.models import AgentRun, AttemptStatus, utcnow
from baseline.runs import driver_lease
from baseline.runs.agent_worker import Worker, run_agent
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import egress_gateway

WORKER = "agent worker on portal pid 41 (agent-7, 0a1b2c3d)"


def agent_attempt(ctx: Context, *, started: bool = False) -> int:
    """An agent attempt (no workspace: no driver ever gets past the lease in these tests)."""
    with ctx.session() as session:
        study = studies.create_study(
            session,
            studies.StudySpec(
                name="lease study",
                egress_policy="none",
                working_time_limit_hours=1,
                checkpoint_hours=[1],
                reproduction_timeout_minutes=5,
            ),
            None,
        )
        paper = next(t for t in tasks.import_demo_tasks(session, ctx.settings)
                     if t.slug == "digits-baselines")  # fmt: skip
        studies.add_task(session, study, paper, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(
            session, study, "basic agent", "basic", "fake-agent", "http://127.0.0.1:9/v1",
            {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}, None,
        )  # fmt: skip
        attempt = studies.create_attempt(session, agent, paper, None)
        if started:
            attempt.status = AttemptStatus.RUNNING
            attempt.started_at = utcnow()
        return attempt.id


def runs_of(ctx: Context, attempt_id: int) -> int:
    with ctx.session() as session:
        return session.query(AgentRun).filter(AgentRun.attempt_id == attempt_id).count()


def test_a_second_driver_refuses_naming_the_holder_until_the_lease_expires(ctx: Context) -> None:
    attempt_id = agent_attempt(ctx)
    now = utcnow()
    driver_lease.acquire(ctx, attempt_id, WORKER, ttl_s=60, now=now)
    with pytest.raises(driver_lease.DriverBusy, match="driven by agent worker on portal pid 41"):
        driver_lease.acquire(ctx, attempt_id, "agent run B", now=now + timedelta(seconds=59))
    driver_lease.acquire(ctx, attempt_id, WORKER, now=now + timedelta(seconds=30))  # its own
    # The holder died (stopped renewing): its lease expires and the next driver takes it.
    later = now + timedelta(seconds=30 + 61)
    driver_lease.acquire(ctx, attempt_id, "agent run B", now=later)
    assert not driver_lease.renew(ctx, attempt_id, WORKER, now=later)
    with pytest.raises(driver_lease.DriverBusy, match="driven by agent run B"):
        driver_lease.acquire(ctx, attempt_id, WORKER, now=later)


def test_a_live_holder_keeps_its_lease_by_renewing_and_releases_it_when_done(
    ctx: Context,
) -> None:
    attempt_id = agent_attempt(ctx)
    lease = driver_lease.hold(ctx, attempt_id, "agent worker", ttl_s=0.6, renew_every_s=0.1)
    try:
        time.sleep(1.5)  # past two TTLs: only the renewals keep it
        with pytest.raises(driver_lease.DriverBusy, match="driven by agent worker on"):
            driver_lease.acquire(ctx, attempt_id, "agent run B")
        lease.check()  # still the holder
    finally:
        lease.close()
    driver_lease.acquire(ctx, attempt_id, "agent run B")  # released: no waiting for the expiry


def test_a_holder_whose_lease_was_taken_over_stops(ctx: Context) -> None:
    attempt_id = agent_attempt(ctx)
    lease = driver_lease.hold(ctx, attempt_id, "agent worker", ttl_s=60, renew_every_s=0.05)
    try:
        # It stalled past its expiry (simulated) and another driver took the attempt over.
        driver_lease.acquire(ctx, attempt_id, "agent run B", now=utcnow() + timedelta(seconds=61))
        deadline = time.monotonic() + 5
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(driver_lease.DriverLost, match="taken over"):
            lease.check()
    finally:
        lease.close()
    with pytest.raises(driver_lease.DriverBusy, match="agent run B"):  # close kept B's lease
        driver_lease.acquire(ctx, attempt_id, "agent run C")


@pytest.mark.sqlite_only  # the conditional UPDATE is `renew`'s, tested on both above
def test_a_fence_finds_a_takeover_at_once_and_keeps_a_live_holders_lease_a_ttl(
    ctx: Context,
) -> None:
    """Before a model call a driver fences: `check` only knows what the renewer's last round
    found (up to 15 s old), the fence asks the database and renews."""
    attempt_id = agent_attempt(ctx)
    lease = driver_lease.hold(ctx, attempt_id, "agent worker", ttl_s=60, renew_every_s=3600)
    try:
        start = utcnow()
        lease.fence()  # the holder: renewed, so nobody can take it for a TTL from now
        with pytest.raises(driver_lease.DriverBusy, match="driven by agent worker"):
            driver_lease.acquire(ctx, attempt_id, "agent run B", now=start + timedelta(seconds=59))
        driver_lease.acquire(ctx, attempt_id, "agent run B", now=start + timedelta(seconds=61))
        lease.check()  # the renewer has not looked yet
        with pytest.raises(driver_lease.DriverLost, match="taken over"):
            lease.fence()
        assert lease.lost
    finally:
        lease.close()
    with pytest.raises(driver_lease.DriverBusy, match="agent run B"):  # B's lease kept
        driver_lease.acquire(ctx, attempt_id, "agent run C", now=utcnow() + timedelta(seconds=61))


def test_agent_run_refuses_while_the_worker_drives_the_attempt(ctx: Context) -> None:
    """`baseline agent run ID` beside the worker: exit 1, the holder named, nothing driven."""
    attempt_id = agent_attempt(ctx, started=True)
    driver_lease.acquire(ctx, attempt_id, WORKER)
    out, err = io.StringIO(), io.StringIO()
    env = {
        **os.environ,
        "BASELINE_HOME": str(ctx.settings.home),
        "BASELINE_DATABASE_URL": ctx.settings.database_url,
    }
    with (
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as exit_,
    ):
        main(["agent", "run", str(attempt_id)])
    assert exit_.value.code == 1
    assert f"attempt {attempt_id} is driven by {WORKER}" in err.getvalue()
    assert runs_of(ctx, attempt_id) == 0


def test_the_worker_leaves_an_attempt_another_driver_holds(ctx: Context) -> None:
    attempt_id = agent_attempt(ctx, started=True)
    driver_lease.acquire(ctx, attempt_id, "agent run on a laptop")
    worker = Worker(ctx)
    assert worker.poll() == [attempt_id]
    worker.join()
    assert worker.errors == {}  # not an error: polled again once that driver is gone
    assert runs_of(ctx, attempt_id) == 0


def test_the_worker_waits_for_an_egress_proxy_that_cannot_start_yet(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver starts the attempt's proxy before its first step; a proxy that cannot start
    (the engine busy, mitmdump missing) leaves the attempt undriven, its clock not started, for
    the next poll: not an error that keeps the worker off it for good."""
    attempt_id = agent_attempt(ctx, started=True)

    def unavailable(ctx_: Context, attempt_id_: int) -> None:
        raise egress_gateway.EgressUnavailable("the egress proxy did not start: test")

    monkeypatch.setattr(egress_gateway, "ensure_attempt_proxy", unavailable)
    worker = Worker(ctx)
    assert worker.poll() == [attempt_id]
    worker.join()
    assert worker.errors == {} and runs_of(ctx, attempt_id) == 0
    with pytest.raises(egress_gateway.EgressUnavailable):  # `agent run` says why, exits 1
        run_agent(ctx, attempt_id)
    driver_lease.acquire(ctx, attempt_id, "next driver")  # the lease was given back
