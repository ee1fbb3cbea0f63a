"""The API covers every coordinator, grader and analyst action of the portal, end to end.

One study is driven through /api/v1 only (bar the workspace launch, which needs Docker: the clock
is started by the domain function `launch` calls): tasks import and study tasks, attempt create,
pause, resume, extend, snapshot and submit; snapshots (list, manifest, download, diff);
reproduction logs; blind expert grading; gradings and leaf grades; scores over time; the tidy
table as CSV and Parquet. Bad input answers 4xx with a message.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from baseline.attempts import attempts, snapshots
from baseline.context import Context
from baseline.models import Attempt, JobStatus, Reproduction, Role
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks.tasks import DEMO_TASKS_DIR
from tests.conftest import Users

PAPER_TASK = DEMO_TASKS_DIR / "digits-baselines"


@dataclass
class Api:
    client: FlaskClient
    tokens: dict[Role, str]

    def call(self, role: Role, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        return self.client.open(f"/api/v1{path}", method=method, headers=headers, **kwargs)


@pytest.fixture
def api(client: FlaskClient, ctx: Context, users: Users) -> Api:
    with ctx.session() as session:
        tokens = {
            role: accounts.issue_token(session, session.merge(users[role]), "api-test")
            for role in Role
        }
    return Api(client, tokens)


@pytest.fixture
def submission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The attempt's submission folder, read by the snapshots as a workspace would be."""
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "README.md").write_text("first\n")

    def finder(_session: Session, _attempt: Attempt) -> snapshots.SubmissionSource:
        return snapshots.DirectorySource(str(folder))

    monkeypatch.setattr(snapshots, "_FINDERS", [finder])
    return folder


def _archive(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return buffer.getvalue()


def _import(api: Api) -> dict[str, Any]:
    response = api.call(
        Role.COORDINATOR,
        "POST",
        "/tasks/import",
        data={"archive": (io.BytesIO(_archive(PAPER_TASK)), "task.tar.gz")},
        content_type="multipart/form-data",
    )
    assert response.status_code == 201, response.json
    return dict(response.json)


def test_coordinator_grader_and_analyst_drive_a_study_through_the_api(
    api: Api, ctx: Context, submission: Path
) -> None:
    coordinator = Role.COORDINATOR
    imported = _import(api)
    assert imported["created"] is True and imported["task"]["slug"] == "digits-baselines"
    assert _import(api)["created"] is False  # identical content: idempotent
    task_id = imported["task"]["id"]

    study = api.call(coordinator, "POST", "/studies", json={"name": "API study"}).json
    assert study["snapshot_policy"] == "baseline"
    like_paperbench = api.call(
        coordinator, "POST", "/studies", json={"name": "Tarball", "snapshot_policy": "paperbench"}
    ).json
    assert like_paperbench["snapshot_policy"] == "paperbench"
    added = api.call(
        coordinator, "POST", f"/studies/{study['id']}/tasks", json={"task_id": task_id}
    )
    assert added.status_code == 201 and [t["id"] for t in added.json["tasks"]] == [task_id]
    again = api.call(
        coordinator, "POST", f"/studies/{study['id']}/tasks", json={"task_id": task_id}
    )
    assert again.status_code == 409 and "already part" in again.json["message"]
    listed = api.call(coordinator, "GET", f"/studies/{study['id']}/tasks").json["tasks"]
    assert [t["slug"] for t in listed] == ["digits-baselines"]

    agent = api.call(
        coordinator,
        "POST",
        f"/studies/{study['id']}/agents",
        json={"name": "Agent A", "scaffold": "basic", "model": "fake-model"},
    ).json
    created = api.call(
        coordinator,
        "POST",
        f"/studies/{study['id']}/attempts",
        json={"participant_id": agent["id"], "task_id": task_id},
    )
    assert created.status_code == 201 and created.json["status"] == "pending"
    attempt_id = created.json["id"]
    # one created twice by mistake is withdrawn before it starts
    extra = api.call(
        coordinator,
        "POST",
        f"/studies/{study['id']}/attempts",
        json={"participant_id": agent["id"], "task_id": task_id},
    ).json["id"]
    withdrawn = api.call(
        coordinator, "POST", f"/attempts/{extra}/withdraw", json={"reason": "created twice"}
    )
    assert withdrawn.status_code == 200 and withdrawn.json["withdrawn"] == extra
    assert api.call(coordinator, "GET", f"/attempts/{extra}").status_code == 404
    # `launch` places a Docker workspace, then calls this to start the clock.
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)

    paused = api.call(coordinator, "POST", f"/attempts/{attempt_id}/pause", json={"note": "lunch"})
    assert paused.status_code == 200 and paused.json["attempt"]["status"] == "paused"
    # Each answer carries the clock as it is now (the attempt's page shows it; the API did not).
    stopped = paused.json["attempt"]["clock"]
    assert stopped["paused"] and stopped["pause_reason"] == "admin"
    read = api.call(coordinator, "GET", f"/attempts/{attempt_id}").json["clock"]
    assert read["working_s"] == pytest.approx(stopped["working_s"])  # a paused clock stays
    resumed = api.call(coordinator, "POST", f"/attempts/{attempt_id}/resume")
    assert resumed.status_code == 200 and resumed.json["attempt"]["status"] == "running"
    assert resumed.json["attempt"]["clock"]["pause_reason"] is None
    extended = api.call(
        coordinator, "POST", f"/attempts/{attempt_id}/extend", json={"hours": 2, "reason": "outage"}
    )
    assert extended.status_code == 200
    assert extended.json["attempt"]["working_time_limit_s"] == (48 + 2) * 3600
    after = extended.json["attempt"]["clock"]
    assert after["limit_s"] == (48 + 2) * 3600
    assert after["remaining_s"] == pytest.approx(after["limit_s"] - after["working_s"])
    # sent again from the limit it read (48 h): refused, nothing added
    twice = api.call(
        coordinator,
        "POST",
        f"/attempts/{attempt_id}/extend",
        json={"hours": 2, "reason": "outage", "seen_limit_hours": 48},
    )
    assert twice.status_code == 409 and "nothing was added" in twice.json["message"]
    assert api.call(coordinator, "GET", f"/attempts/{attempt_id}").json["clock"]["limit_s"] == (
        50 * 3600
    )
    manual = api.call(coordinator, "POST", f"/attempts/{attempt_id}/snapshot")
    assert manual.status_code == 201 and manual.json["snapshot"]["kind"] == "manual"

    (submission / "results.txt").write_text("accuracy 0.97\n")
    submitted = api.call(coordinator, "POST", f"/attempts/{attempt_id}/submit")
    assert submitted.status_code == 200 and submitted.json["attempt"]["status"] == "submitted"
    final_id = submitted.json["snapshot"]["id"]
    twice = api.call(coordinator, "POST", f"/attempts/{attempt_id}/submit")
    assert twice.status_code == 409 and "ended" in twice.json["message"]

    taken = api.call(coordinator, "GET", f"/attempts/{attempt_id}/snapshots").json["snapshots"]
    assert final_id in [s["id"] for s in taken] and len(taken) >= 3
    manifest = api.call(coordinator, "GET", f"/snapshots/{final_id}/manifest").json
    assert {f["path"] for f in manifest["files"]} == {"README.md", "results.txt"}
    download = api.call(coordinator, "GET", f"/snapshots/{final_id}/download")
    assert download.status_code == 200 and download.mimetype == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(download.data)) as tar:
        assert "submission/results.txt" in tar.getnames()
    change = api.call(coordinator, "GET", f"/snapshots/{final_id}/diff?against={taken[0]['id']}")
    assert change.status_code == 200 and change.json["added"] == ["results.txt"]

    with ctx.session() as session:
        log_sha = snapshots.store_for(ctx).put_bytes(b"reproduce.sh: accuracy 0.97\n")
        run = Reproduction(
            snapshot_id=final_id, status=JobStatus.SUCCEEDED, exit_code=0, log_sha256=log_sha
        )
        session.add(run)
        session.flush()
        run_id = run.id
    runs = api.call(coordinator, "GET", f"/snapshots/{final_id}/reproductions").json
    assert [r["id"] for r in runs["reproductions"]] == [run_id]
    log = api.call(Role.GRADER, "GET", f"/reproductions/{run_id}/log")
    assert log.status_code == 200 and b"accuracy 0.97" in log.data

    queue = api.call(Role.GRADER, "GET", "/expert-grading/queue").json["snapshots"]
    assert final_id in [row["id"] for row in queue]
    assert "Agent A" not in str(queue) and "fake-model" not in str(queue)
    sheet = api.call(Role.GRADER, "GET", f"/expert-grading/snapshots/{final_id}").json
    row = next(r for r in queue if r["id"] == final_id)
    # Graders see a per-attempt blind label, never the participant's name or group.
    assert sheet["snapshot"]["pseudonym"] == row["pseudonym"] and sheet["mine"] == []
    assert agent["display_name"] not in str(sheet["snapshot"])
    first_leaf = sheet["leaves"][0]["path"]
    saved = api.call(
        Role.GRADER,
        "PUT",
        f"/expert-grading/snapshots/{final_id}/grades",
        json={"grades": [{"path": first_leaf, "score": 1, "note": "ran"}]},
    )
    assert saved.status_code == 200 and saved.json["leaves_graded"] == 1
    sheet = api.call(Role.GRADER, "GET", f"/expert-grading/snapshots/{final_id}").json
    assert sheet["mine"] == [{"path": first_leaf, "score": 1, "note": "ran"}]
    bad_leaf = api.call(
        Role.GRADER,
        "PUT",
        f"/expert-grading/snapshots/{final_id}/grades",
        json={"grades": [{"path": "9.9.9", "score": 1}]},
    )
    assert bad_leaf.status_code == 422 and "no leaf 9.9.9" in bad_leaf.json["message"]

    gradings = api.call(coordinator, "GET", f"/snapshots/{final_id}/gradings").json["gradings"]
    expert = next(gr for gr in gradings if gr["kind"] == "expert")
    detail = api.call(coordinator, "GET", f"/gradings/{expert['id']}").json
    assert [(leaf["leaf_path"], leaf["score"]) for leaf in detail["leaves"]] == [(first_leaf, 1.0)]
    tree = api.call(coordinator, "GET", f"/gradings/{expert['id']}/tree").json["tree"]
    assert "sub_tasks" in tree
    scores = api.call(coordinator, "GET", f"/attempts/{attempt_id}/scores").json
    final = next(s for s in scores["snapshots"] if s["snapshot_id"] == final_id)
    assert [gr["kind"] for gr in final["gradings"]] == ["expert"]

    csv = api.call(Role.ANALYST, "GET", f"/studies/{study['id']}/table.csv")
    assert csv.status_code == 200 and csv.mimetype == "text/csv"
    table = pd.read_csv(io.BytesIO(csv.data))
    parquet = api.call(Role.ANALYST, "GET", f"/studies/{study['id']}/table.parquet")
    assert parquet.status_code == 200
    typed = pd.read_parquet(io.BytesIO(parquet.data))
    assert len(table) == len(typed) > 0 and set(typed["attempt_id"]) == {attempt_id}
    assert typed["score"].dtype == "float64"


def test_bad_input_answers_4xx_with_a_message(api: Api, ctx: Context, users: Users) -> None:
    coordinator = Role.COORDINATOR
    garbage = api.call(
        coordinator,
        "POST",
        "/tasks/import",
        data={"archive": (io.BytesIO(b"not a tarball"), "task.tar.gz")},
        content_type="multipart/form-data",
    )
    assert garbage.status_code == 422 and "archive" in garbage.json["message"]
    empty_folder = io.BytesIO()
    with tarfile.open(fileobj=empty_folder, mode="w:gz") as tar:
        info = tarfile.TarInfo("notes.txt")
        tar.addfile(info, io.BytesIO(b""))
    not_a_task = api.call(
        coordinator,
        "POST",
        "/tasks/import",
        data={"archive": (io.BytesIO(empty_folder.getvalue()), "task.tar.gz")},
        content_type="multipart/form-data",
    )
    assert not_a_task.status_code == 422 and "not a task folder" in not_a_task.json["message"]
    assert "/tmp" not in not_a_task.json["message"]  # no server paths in the message

    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Bad input"), None)
        me = studies.enroll_human(session, study.id, session.merge(users[Role.PARTICIPANT]), None)
        study_id, participant_id = study.id, me.id
    missing_task = api.call(
        coordinator,
        "POST",
        f"/studies/{study_id}/attempts",
        json={"participant_id": participant_id, "task_id": 999},
    )
    assert missing_task.status_code == 404 and "no task" in missing_task.json["message"]
    negative = api.call(
        coordinator, "POST", "/attempts/1/extend", json={"hours": -1, "reason": "x"}
    )
    assert negative.status_code == 422 and "hours" in negative.json["message"]
    refused = api.call(Role.PARTICIPANT, "POST", "/attempts/1/launch")
    assert refused.status_code == 403
    analyst_blind = api.call(Role.ANALYST, "GET", "/attempts/1/snapshots")
    assert analyst_blind.status_code == 403


def test_participant_acts_on_own_attempt_only(
    api: Api, ctx: Context, users: Users, submission: Path
) -> None:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Own only"), None)
        task = _seed_task(session)
        studies.add_task(session, study, task, None)
        me = studies.enroll_human(session, study.id, session.merge(users[Role.PARTICIPANT]), None)
        other = studies.add_agent(session, study, "Other", "basic", "m", "", {}, None)
        mine = studies.create_attempt(session, me, task, None).id
        theirs = studies.create_attempt(session, other, task, None).id
        participant_id = users[Role.PARTICIPANT].id
    for attempt_id in (mine, theirs):
        attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    attempts.first_login(ctx, mine, participant_id)
    me_ = Role.PARTICIPANT
    assert api.call(me_, "POST", f"/attempts/{theirs}/pause", json={}).status_code == 404
    as_admin = api.call(me_, "POST", f"/attempts/{mine}/pause", json={"reason": "admin"})
    assert as_admin.status_code == 403 and "participant" in as_admin.json["message"]
    assert api.call(Role.COORDINATOR, "POST", f"/attempts/{mine}/pause", json={}).status_code == 200
    team_pause = api.call(me_, "POST", f"/attempts/{mine}/resume")
    assert team_pause.status_code == 403 and "study team" in team_pause.json["message"]
    assert api.call(Role.COORDINATOR, "POST", f"/attempts/{mine}/resume").status_code == 200
    own = api.call(me_, "POST", f"/attempts/{mine}/pause", json={"note": "break"})
    assert own.status_code == 200 and own.json["attempt"]["status"] == "paused"
    assert api.call(me_, "POST", f"/attempts/{mine}/resume").status_code == 200
    done = api.call(me_, "POST", f"/attempts/{mine}/submit")
    assert done.status_code == 200 and done.json["attempt"]["status"] == "submitted"
    assert api.call(me_, "POST", f"/attempts/{theirs}/submit").status_code == 404


def _seed_task(session: Session) -> Any:
    from baseline.models import Task, TaskKind

    task = Task(slug="own-only", title="Own only", kind=TaskKind.PAPER, content_hash="0" * 64)
    session.add(task)
    session.flush()
    return task
