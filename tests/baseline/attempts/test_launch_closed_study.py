"""A closed or archived study launches none of its pending attempts: not from the domain, the
CLI, the API or the portal, and the scheduler's `start_placed_attempts` does not start one placed
after its study closed. The refusals come before any image or workspace is asked for, so no
Docker is needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.attempts import launch
from baseline.cli import main
from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    Role,
    StudyStatus,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.people import accounts
from baseline.studies import studies
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.conftest import Users, login

pytestmark = pytest.mark.sqlite_only

FINISHED = [StudyStatus.CLOSED, StudyStatus.ARCHIVED]


def _no_image(profile: str) -> str:
    raise AssertionError("a refused launch asks for no image")


def _set_status(ctx: Context, attempt_id: int, status: StudyStatus) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        studies.set_status(session, attempt.study, status, None)


def _unlaunched(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        assert (attempt.status, attempt.started_at) == (AttemptStatus.PENDING, None)
        assert session.scalars(select(Workspace)).all() == []


@pytest.mark.parametrize("status", FINISHED)
def test_domain_launch_is_refused(ctx: Context, status: StudyStatus) -> None:
    attempt_id = make_attempt(ctx)
    _set_status(ctx, attempt_id, status)
    with pytest.raises(Conflict, match=rf"not launched: study .* is {status.value}"):
        launch.launch(ctx, attempt_id, None, image_resolver=_no_image)
    _unlaunched(ctx, attempt_id)


def test_cli_launch_names_the_closed_study(
    ctx: Context, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)
    attempt_id = make_attempt(ctx)
    _set_status(ctx, attempt_id, StudyStatus.CLOSED)
    with pytest.raises(SystemExit) as exited:
        main(["attempt", "launch", str(attempt_id), "--image", "unused"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: attempt {attempt_id} not launched: study ")
    assert "is closed" in err and "Traceback" not in err
    _unlaunched(ctx, attempt_id)


def test_api_launch_answers_409(client: FlaskClient, ctx: Context, users: Users) -> None:
    attempt_id = make_attempt(ctx)
    _set_status(ctx, attempt_id, StudyStatus.ARCHIVED)
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
    response = client.post(
        f"/api/v1/attempts/{attempt_id}/launch", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 409
    assert response.json is not None and response.json["error"] == "conflict"
    assert "is archived" in response.json["message"]
    _unlaunched(ctx, attempt_id)


def test_portal_launch_button_answers_409(client: FlaskClient, ctx: Context, users: Users) -> None:
    attempt_id = make_attempt(ctx)
    _set_status(ctx, attempt_id, StudyStatus.CLOSED)
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None
    response = client.post(f"/attempts/{attempt_id}/launch", data={"csrf_token": token.group(1)})
    assert response.status_code == 409
    assert "is closed" in response.get_data(as_text=True)
    _unlaunched(ctx, attempt_id)


def test_attempt_placed_after_its_study_closed_is_not_started(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launched while active, left pending for want of a host, placed by reconcile after the
    study closed: its clock does not start, until the study is active again."""
    monkeypatch.setattr(launch, "resolve_source", directory_resolver(tmp_path))
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        host = Host(name="h", docker_url="unix:///nowhere.sock", healthy=True)
        session.add(host)
        session.flush()
        session.add(Workspace(attempt_id=attempt_id, purpose=WorkspacePurpose.ATTEMPT,
                              host_id=host.id, backend="docker", name=f"ws-a{attempt_id}",
                              image="img", hardware_profile="cpu",
                              status=WorkspaceStatus.RUNNING))  # fmt: skip
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.READY
    _set_status(ctx, attempt_id, StudyStatus.CLOSED)
    assert launch.start_placed_attempts(ctx) == []
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.started_at is None
    _set_status(ctx, attempt_id, StudyStatus.ACTIVE)
    assert launch.start_placed_attempts(ctx) == [attempt_id]
