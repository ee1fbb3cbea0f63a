"""Issue 40 item 2: a study created in the portal sets its judge, checked; without one, a study
with paper tasks says that their snapshots are never graded."""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.context import Context
from baseline.demo.replay_model import JUDGE_PREFIX, ReplayModel
from baseline.jobs import orchestration
from baseline.models import (
    AuditEvent,
    Grading,
    GradingKind,
    JobStatus,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    StudyStatus,
    Task,
    TaskKind,
)
from baseline.studies import studies
from baseline.tasks import tasks
from infra.blobs import BlobStore
from tests.app.html_form import form_fields
from tests.conftest import Users, login

JUDGE = JUDGE_PREFIX + "digits-baselines"
FREE = {"judge_input_usd_per_mtok": "0", "judge_output_usd_per_mtok": "0"}


def _csrf(client: FlaskClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True))
    assert match, f"no CSRF token on {path}"
    return match.group(1)


def _create(client: FlaskClient, name: str, **judge: str) -> tuple[int, str]:
    response = client.post(
        "/studies/new",
        data={"name": name, "hardware_profile": "cpu", "csrf_token": _csrf(client, "/studies/new"),
              **judge},
    )  # fmt: skip
    text = response.get_data(as_text=True)
    return response.status_code, text


def test_a_study_created_in_the_portal_gets_its_judge_checked(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    login(client, users[Role.COORDINATOR].email)
    with ReplayModel() as replay:
        url = replay.base_url
        status, _ = _create(
            client, "Judged", judge_base_url=replay.base_url, judge_model=JUDGE, **FREE
        )
        assert status == 302
        page = client.get("/studies/").get_data(as_text=True)  # the flashes show on next page
    assert "The judge answered: " + JUDGE in page
    with ctx.session() as session:
        study = session.scalar(select(Study).where(Study.name == "Judged"))
        assert study is not None
        judge = orchestration.study_judge(study)
        assert judge is not None and judge.config.model == JUDGE
        assert judge.config.base_url == url
        audit = session.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "study.judge", AuditEvent.target_id == str(study.id)
            )
        )
        assert audit is not None and audit.details["model"] == JUDGE


def test_an_unreachable_judge_is_saved_and_said_not_to_answer(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    login(client, users[Role.COORDINATOR].email)
    with ctx.session() as session:
        study_id = studies.create_study(session, studies.StudySpec(name="Far"), None).id
    path = f"/studies/{study_id}"
    response = client.post(
        f"{path}/judge",
        data={"csrf_token": _csrf(client, path), "judge_base_url": "http://127.0.0.1:9/v1",
              "judge_model": "self-hosted", **FREE},
    )  # fmt: skip
    assert response.status_code == 303
    page = client.get(path).get_data(as_text=True)
    assert "The judge did not answer: connection check call failed" in page
    assert "graded by <strong>self-hosted</strong>" in page


def test_bad_judge_settings_get_a_clear_error(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.COORDINATOR].email)
    for judge, message in [
        ({"judge_model": "o3-mini"}, "judge: give both the endpoint (base URL) and the model"),
        ({"judge_base_url": "api.example.org", "judge_model": "x"}, "an http:// or https:// URL"),
        (
            {"judge_base_url": "http://127.0.0.1:9/v1", "judge_model": "my-own-model"},
            "judge: no price known for model &#39;my-own-model&#39;",
        ),
        (
            {"judge_base_url": "http://h/v1", "judge_model": "m", "judge_input_usd_per_mtok": "1"},
            "judge price: give both",
        ),
    ]:
        status, text = _create(client, "Bad judge", **judge)
        assert status == 422 and message in text, (judge, status)


def _judge_form(client: FlaskClient, path: str) -> dict[str, str]:
    return form_fields(client.get(path).get_data(as_text=True), f"{path}/judge#judge")


def _stored_judge(ctx: Context, study_id: int) -> orchestration.StudyJudge | None:
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        return orchestration.study_judge(study)


def test_a_judge_set_from_a_stale_page_does_not_replace_a_newer_one_unseen(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """Two tabs (or two coordinators) opened the study page; one set the judge's model, the
    other its endpoint: the second save replaced the first's judge unseen. It is refused, with
    the judge as it is now named and what was typed kept; saved again, knowingly, it applies."""
    login(client, users[Role.COORDINATOR].email)
    with ctx.session() as session:
        study_id = studies.create_study(session, studies.StudySpec(name="Two tabs"), None).id
    path = f"/studies/{study_id}"
    first = {"judge_base_url": "http://127.0.0.1:9/v1", "judge_model": "self-hosted", **FREE}
    assert (
        client.post(f"{path}/judge", data={**_judge_form(client, path), **first}).status_code == 303
    )
    tab_a, tab_b = _judge_form(client, path), _judge_form(client, path)
    assert tab_a["judge_model"] == "self-hosted" and tab_a["shown_judge"] != "none"
    assert (
        client.post(f"{path}/judge", data={**tab_a, "judge_model": "other-model"}).status_code
        == 303
    )
    refused = client.post(
        f"{path}/judge", data={**tab_b, "judge_base_url": "http://127.0.0.1:8/v1"}
    )
    page = refused.get_data(as_text=True)
    assert refused.status_code == 409, page[:2000]
    assert "The judge was changed since you opened this page: it is other-model at" in page
    again = form_fields(page, f"{path}/judge#judge")
    assert again["judge_base_url"] == "http://127.0.0.1:8/v1"  # what this tab typed, kept
    assert again["judge_model"] == "self-hosted"
    judge = _stored_judge(ctx, study_id)
    assert judge is not None and judge.config.model == "other-model"
    assert judge.config.base_url == "http://127.0.0.1:9/v1"
    # saved again from the refused page, it applies: this tab's judge, chosen knowingly
    assert client.post(f"{path}/judge", data=again).status_code == 303
    judge = _stored_judge(ctx, study_id)
    assert judge is not None and judge.config.base_url == "http://127.0.0.1:8/v1"
    assert judge.config.model == "self-hosted"
    # the same judge sent again (a second click) changes and audits nothing
    with ctx.session() as session:
        events = select(AuditEvent).where(AuditEvent.action == "study.judge")
        before = len(session.scalars(events).all())
    repeated = client.post(f"{path}/judge", data=again, follow_redirects=True)
    assert "already: nothing changed" in repeated.get_data(as_text=True)
    with ctx.session() as session:
        assert len(session.scalars(events).all()) == before


def test_a_refused_judge_keeps_what_was_typed(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    login(client, users[Role.COORDINATOR].email)
    with ctx.session() as session:
        study_id = studies.create_study(session, studies.StudySpec(name="Typo"), None).id
    path = f"/studies/{study_id}"
    typed = {"judge_base_url": "api.example.org/v1", "judge_model": "a-long-model-name", **FREE}
    refused = client.post(f"{path}/judge", data={**_judge_form(client, path), **typed})
    page = refused.get_data(as_text=True)
    assert refused.status_code == 422
    assert 'id="judge-error"' in page and "an http:// or https:// URL" in page
    shown = form_fields(page, f"{path}/judge#judge")
    assert shown["judge_base_url"] == "api.example.org/v1"
    assert shown["judge_model"] == "a-long-model-name"
    assert _stored_judge(ctx, study_id) is None


def test_a_paper_task_in_a_study_without_a_judge_says_so(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    with ctx.session() as session:
        store = BlobStore(ctx.settings.blob_dir)
        task = tasks.import_task(session, store, tasks.DEMO_TASKS_DIR / "digits-baselines").task
        study = studies.create_study(session, studies.StudySpec(name="Unjudged"), None)
        studies.add_task(session, study, task, None)
        study_id = study.id
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert "No judge is set, so the snapshots of this study's paper tasks" in page
    assert "needs a judge" in page
    # archived, it is kept for the record: no judge is set on it (the form is gone, a post refused)
    with ctx.session() as session:
        stored = session.get(Study, study_id)
        assert stored is not None
        studies.set_status(session, stored, StudyStatus.ARCHIVED, None)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert 'id="judge-archived"' in page and "Set the judge and check" not in page
    assert "No judge is set, so the snapshots" not in page
    refused = client.post(
        f"/studies/{study_id}/judge",
        data={"csrf_token": _csrf(client, f"/studies/{study_id}"), "judge_model": "gpt-4.1",
              "judge_base_url": "http://127.0.0.1:9/v1"},
    )  # fmt: skip
    assert refused.status_code == 409
    assert "set it closed to change its judge" in refused.get_data(as_text=True)
    with ctx.session() as session:
        stored = session.get(Study, study_id)
        assert stored is not None and orchestration.study_judge(stored) is None


def test_the_study_s_attempt_list_shows_each_attempt_s_latest_score(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """Issue 40 item 5: scores took 3 clicks per attempt; the list now shows the latest judged
    or scored one, an ungraded attempt a dash, and never an expert grading or a failed one."""
    with ctx.session() as session:
        task = Task(slug="listed", title="Listed", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        study = studies.create_study(session, studies.StudySpec(name="Listed"), None)
        session.flush()
        studies.add_task(session, study, task, None)
        participant = studies.enroll_human(
            session, study.id, session.merge(users[Role.PARTICIPANT]), None
        )
        graded = studies.create_attempt(session, participant, task, None)
        waiting = studies.create_attempt(session, participant, task, None)
        snapshots: dict[float, int] = {}
        for hours, kind, status, score in [
            (2.0, GradingKind.JUDGE, JobStatus.SUCCEEDED, 0.25),
            (8.0, GradingKind.JUDGE, JobStatus.SUCCEEDED, 0.625),
            (8.0, GradingKind.EXPERT, JobStatus.SUCCEEDED, 0.9),
            (16.0, GradingKind.JUDGE, JobStatus.FAILED, None),
        ]:
            if hours not in snapshots:
                snapshot = Snapshot(attempt_id=graded.id, kind=SnapshotKind.CHECKPOINT,
                                    due_working_s=hours * 3600, taken_working_s=hours * 3600,
                                    manifest_sha256="0" * 64)  # fmt: skip
                session.add(snapshot)
                session.flush()
                snapshots[hours] = snapshot.id
            session.add(
                Grading(snapshot_id=snapshots[hours], kind=kind, status=status, score=score)
            )
        study_id, graded_id, waiting_id = study.id, graded.id, waiting.id
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r'/attempts/(\d+)">\1</a>(.*?)</tr>', page, re.S)
    }
    assert "<strong>0.625</strong>" in rows[graded_id] and "at 8 h (judge)" in rows[graded_id]
    assert "<strong>" not in rows[waiting_id] and "—" in rows[waiting_id]
