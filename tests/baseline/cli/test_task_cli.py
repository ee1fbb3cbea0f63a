"""Acceptance (issue 10): `task` inside a real Docker workspace against the real portal.

A human's attempt is launched into a workspace with no network at all (egress policy ``none``);
the portal is served on a loopback port and the portal relay tunnels the workspace's loopback to
it over ``docker exec``. As the workspace user, `task` reads the clock, leaves a note, pauses and
resumes, is refused a score on a paper task and a submission without confirmation, is refused
with another attempt's token, submits with ``--yes``, and is refused once the attempt has ended
(its token revoked). Every call is in the attempt's audit trail.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select
from werkzeug.serving import make_server

from baseline.attempts import attempts, launch
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Host,
    PauseReason,
    Role,
    Workspace,
    utcnow,
)
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import attempt_tokens, workspaces
from infra.docker_backend import DockerBackend
from infra.portal_relay import PortalRelay
from infra.workspace import (
    ExecResult,
    HardwareProfile,
    WorkspaceBackend,
    WorkspaceHandle,
    WorkspaceSpec,
)
from tests.agents.agent_world import cleanup, factory
from tests.conftest import Users
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image

CONFIG = f"{attempt_tokens.CONFIG_DIR}/{attempt_tokens.CONFIG_FILE}"
pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]


@pytest.fixture
def portal_port(app: Any) -> Iterator[int]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_port)
    server.shutdown()


def _human_attempt(ctx: Context, users: Users, engine_url: str | None) -> tuple[int, int]:
    """Two pending attempts of one participant in two studies (and a host at `engine_url`)."""
    with ctx.session() as session:
        if engine_url is not None:
            host = workspaces.add_host(session, "engine", engine_url, None)
            assert workspaces.check_host(session, host).healthy
        paper = next(t for t in tasks.import_demo_tasks(session, ctx.settings)
                     if t.slug == "digits-baselines")  # fmt: skip
        made = []
        for name in ("task study", "other study"):
            study = studies.create_study(
                session,
                studies.StudySpec(name=name, egress_policy="none", checkpoint_hours=[2, 8]),
                None,
            )
            studies.add_task(session, study, paper, None)
            session.flush()
            me = studies.enroll_human(
                session, study.id, session.merge(users[Role.PARTICIPANT]), None
            )
            made.append(studies.create_attempt(session, me, paper, None).id)
    mine, other = made
    return mine, other


def _launched(ctx: Context, users: Users, image: str) -> tuple[int, int]:
    """A launched, logged-in human attempt, and a second (pending) attempt of another study."""
    mine, other = _human_attempt(ctx, users, docker_url("unix"))
    status = launch.launch(ctx, mine, None, image=image, backend_factory=factory)
    assert status is AttemptStatus.READY
    assert attempts.first_login(ctx, mine, users[Role.PARTICIPANT].id)
    return mine, other


def _workspace(ctx: Context, attempt_id: int) -> tuple[WorkspaceBackend, WorkspaceHandle]:
    with ctx.session() as session:
        workspace = session.scalar(select(Workspace).where(Workspace.attempt_id == attempt_id))
        assert workspace is not None and workspace.host_id is not None
        host = session.get(Host, workspace.host_id)
        assert host is not None
        return factory(host), workspaces.handle_of(workspace)


def _wait_for_relay(task: Callable[..., ExecResult]) -> ExecResult:
    deadline = time.monotonic() + 30
    while (status := task("status")).exit_code != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    return status


def test_task_commands_against_the_real_portal(
    ctx: Context, users: Users, test_image: str, cleanup: None, portal_port: int
) -> None:
    mine, other = _launched(ctx, users, test_image)
    backend, handle = _workspace(ctx, mine)
    with ctx.session() as session:
        attempt = session.get(Attempt, other)
        assert attempt is not None
        other_token = attempt_tokens.issue(session, attempt, attempt_tokens.AGENT, None)

    def task(*args: str, env: str = "") -> ExecResult:
        line = f"{env} task " + " ".join(f"'{a}'" for a in args)
        return backend.exec(handle, ["bash", "-c", line], timeout_s=60, user="participant")

    def text(result: ExecResult) -> str:
        return result.output.decode()

    # The workspace has no network; only the relay's loopback port leads to the portal.
    offline = backend.exec(handle, ["python3", "-c",
                                    "import socket; socket.create_connection(('1.1.1.1', 80), 3)"],
                           timeout_s=30, user="participant")  # fmt: skip
    assert offline.exit_code != 0
    assert task("status").exit_code == 1  # no relay yet: a clear refusal, not a traceback
    mode = backend.exec(handle, ["stat", "-c", "%a %U", CONFIG], user="participant")
    assert text(mode).strip() == "600 participant"  # the credentials: the workspace user's only
    relay = attempt_tokens.portal_relay(ctx, portal_port, interval_s=0.3)
    relay.start()
    try:
        status = _wait_for_relay(task)
        assert status.exit_code == 0, text(status)
        assert f"attempt {mine}: running" in text(status)
        assert "left 47h" in text(status) or "left 48h" in text(status)
        assert "next checkpoint at 2h00m" in text(status)
        assert "not_started" in text(status)  # the pause that ended at the first login

        assert text(task("note", "tried the SVM first")).strip() == "note recorded"
        paused = task("pause", "lunch")
        assert paused.exit_code == 0, text(paused)
        assert "(paused: participant)" in text(task("status"))
        assert task("resume").exit_code == 0
        score = task("score")
        assert score.exit_code == 1 and "not a scored task" in text(score)
        unconfirmed = task("submit")
        assert unconfirmed.exit_code == 1 and "--yes" in text(unconfirmed)

        # Another attempt's token is refused, even when the file names this attempt.
        forged = json.dumps({"attempt_id": mine, "token": other_token,
                             "url": attempt_tokens.relay_url()})  # fmt: skip
        backend.exec(handle, ["bash", "-c", 'printf %s "$1" > /tmp/forged.json', "w", forged],
                     user="participant")  # fmt: skip
        refused = task("status", env="BASELINE_TASK_CONFIG=/tmp/forged.json")
        assert refused.exit_code == 1
        assert "refused (403): this token belongs to another attempt" in text(refused)

        submitted = task("submit", "--yes")
        assert submitted.exit_code == 0, text(submitted)
        assert "submitted; final snapshot" in text(submitted)
        # Ended: the relay still answers (the submit above was answered through it, though the
        # freeze that ends the attempt kills the participant's other processes), and the
        # workspace token is revoked.
        after = task("status")
        assert after.exit_code == 1, text(after)
        assert "refused (401): unknown or revoked attempt token" in text(after)
        config = json.loads(text(backend.exec(handle, ["cat", CONFIG], user="participant")))
        request = urllib.request.Request(
            f"http://127.0.0.1:{portal_port}/api/v1/attempts/{mine}/workspace/task",
            headers={"Authorization": f"Bearer {config['token']}"},
        )
        with pytest.raises(urllib.error.HTTPError) as revoked:
            urllib.request.urlopen(request, timeout=30)
        assert revoked.value.code == 401
    finally:
        relay.stop()

    with ctx.session() as session:
        attempt = session.get(Attempt, mine)
        assert attempt is not None and attempt.status is AttemptStatus.SUBMITTED
        assert any(
            p.reason is PauseReason.PARTICIPANT and p.note == "lunch" for p in attempt.pauses
        )
        events = session.scalars(
            select(AuditEvent).where(AuditEvent.target_id == str(mine)).order_by(AuditEvent.id)
        ).all()
    actions = [e.action for e in events]
    for action in ("attempt_token.issue", "attempt.workspace.status", "attempt.workspace.note",
                   "attempt.workspace.pause", "attempt.workspace.resume",
                   "attempt.workspace.submit", "attempt_token.revoke"):  # fmt: skip
        assert action in actions, action
    note = next(e for e in events if e.action == "attempt.workspace.note")
    assert note.details["text"] == "tried the SVM first"


@pytest.mark.sshd
def test_task_reaches_the_portal_from_a_remote_host_over_ssh(
    ctx: Context, users: Users, test_image: str, portal_port: int
) -> None:
    """The relay's exec travels over the Docker CLI's SSH connection: no network path either.

    Only the relay differs between local and ssh:// engines, so this test skips the launch (slow
    over SSH) and places a real token of a running attempt into a bare container on that engine."""
    url = docker_url("ssh")
    other, _ = _human_attempt(ctx, users, None)
    with ctx.session() as session:
        attempt = session.get(Attempt, other)
        assert attempt is not None
        attempt.status, attempt.started_at = AttemptStatus.RUNNING, utcnow()
        secret = attempt_tokens.issue(session, attempt, attempt_tokens.WORKSPACE, None)
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    handle = backend.create(
        WorkspaceSpec(name=new_name(), image=test_image, profile=HardwareProfile("cpu"))
    )
    try:
        backend.start(handle)
        body = attempt_tokens.config_json(other, secret, attempt_tokens.relay_url())
        script, config_dir = attempt_tokens.WRITE_CONFIG, attempt_tokens.CONFIG_DIR
        written = backend.exec(handle, ["sh", "-c", script, "w", config_dir, "task.json", body],
                               user="participant")  # fmt: skip
        assert written.exit_code == 0

        def task(*args: str) -> ExecResult:
            return backend.exec(handle, ["task", *args], timeout_s=60, user="participant")

        relay = PortalRelay(
            lambda: {handle.name: (url, handle.container_id)},
            portal_port, attempt_tokens.RELAY_PORT_INSIDE, interval_s=0.3,
        )  # fmt: skip
        relay.start()
        try:
            status = _wait_for_relay(task)
            assert status.exit_code == 0, status.output
            assert f"attempt {other}: running" in status.output.decode()
            assert task("note", "over ssh").output.decode().strip() == "note recorded"
        finally:
            relay.stop()
    finally:
        backend.destroy(handle)
        backend.close()
    with ctx.session() as session:
        notes = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "attempt.workspace.note")
        ).all()
    assert [n.details["text"] for n in notes] == ["over ssh"]
