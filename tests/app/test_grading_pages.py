"""The expert grading portal: blinding, own grades only, several graders, agreement, export,
and the scoring progress of an attempt."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from baseline.attempts.snapshots import DirectorySource, store_for, take_snapshot
from baseline.context import Context
from baseline.models import (
    Grading,
    JobStatus,
    Reproduction,
    Role,
    Snapshot,
    SnapshotKind,
    StudyStatus,
)
from baseline.people import accounts
from tests.app.html_form import form_fields
from tests.conftest import PASSWORD, Users, login
from tests.scoring.scoring_world import (
    AGENT_MODEL,
    PARTICIPANT_NAME,
    ScoringWorld,
    build_world,
    set_study_status,
    snapshot_reference,
)

IDENTIFYING = (PARTICIPANT_NAME, "ada@test.example", AGENT_MODEL, "Agent Smith", "iterative")


@dataclass
class World:
    scoring: ScoringWorld
    first: int
    second: int
    agent_snapshot: int


@pytest.fixture
def world(ctx: Context, tmp_path: Path) -> World:
    scoring = build_world(ctx)
    first = snapshot_reference(
        ctx, scoring.attempt_id, tmp_path / "s1", SnapshotKind.CHECKPOINT, due_working_s=7200
    )
    second = snapshot_reference(
        ctx, scoring.attempt_id, tmp_path / "s2", edit={"README.md": "# Edited readme\n"}
    )
    agent = snapshot_reference(ctx, scoring.agent_attempt_id, tmp_path / "s3")
    store = store_for(ctx)
    with ctx.session() as session:
        snap = session.get(Snapshot, second)
        assert snap is not None
        session.add(
            Reproduction(
                snapshot_id=second,
                status=JobStatus.SUCCEEDED,
                exit_code=1,
                duration_s=3.5,
                failure_class="environment",
                log_sha256=store.put_bytes(b"ModuleNotFoundError: No module named 'sklearn'\n"),
                executed_manifest_sha256=snap.manifest_sha256,
                details={"added": [], "changed": []},
            )
        )
    return World(scoring, first, second, agent)


def _client(app: Flask, email: str) -> FlaskClient:
    client = app.test_client()
    login(client, email)
    return client


def _token(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    return found.group(1)


def _graders(ctx: Context, users: Users) -> tuple[str, str]:
    with ctx.session() as session:
        accounts.create_user(
            session, "grader2@test.example", "Second Grader", PASSWORD, Role.GRADER
        )
    return users[Role.GRADER].email, "grader2@test.example"


def test_grader_pages_are_blind(app: Flask, users: Users, world: World) -> None:
    client = _client(app, users[Role.GRADER].email)
    pages = [
        "/grading/",
        f"/grading/snapshot?snapshot={world.second}",
        f"/grading/snapshot?snapshot={world.agent_snapshot}",
        f"/grading/file?snapshot={world.second}&path=reproduce.py",
        f"/grading/file?snapshot={world.second}&path=README.md&executed=1",
        f"/grading/diff?snapshot={world.second}",
        f"/grading/log?snapshot={world.second}",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        text = response.get_data(as_text=True)
        for secret in IDENTIFYING:
            assert secret not in text, f"{secret!r} leaks on {url}"
        assert not re.search(r"\b(human|agent)\b", text, re.I), f"participant kind on {url}"
    index = client.get("/grading/").get_data(as_text=True)
    # One blind label per attempt (human's and agent's alike), not the participants' pseudonyms.
    assert len(set(re.findall(r"S-[0-9A-F]{6}", index))) >= 2
    page = client.get(f"/grading/snapshot?snapshot={world.second}").get_data(as_text=True)
    assert "environment or dependency error" in page and "exit code 1" in page
    assert "The code loads the 8x8 digits data" in page  # a requirement
    diff = client.get(f"/grading/diff?snapshot={world.second}").get_data(as_text=True)
    assert "+# Edited readme" in diff
    log = client.get(f"/grading/log?snapshot={world.second}").get_data(as_text=True)
    assert "No module named" in log
    # The attempt pages and the agreement stay closed to graders.
    assert client.get(f"/grading/attempt/{world.scoring.attempt_id}").status_code == 403
    assert client.get(f"/grading/agreement/{world.scoring.study_id}").status_code == 403


def test_graders_see_only_their_own_grades_and_agreement_is_computed(
    ctx: Context, app: Flask, users: Users, world: World
) -> None:
    first, second = _graders(ctx, users)
    url = f"/grading/snapshot?snapshot={world.second}"
    a = _client(app, first)
    token = _token(a.get(url).get_data(as_text=True))
    saved = a.post(
        url,
        data={"csrf_token": token, "score:0.0": "1", "note:0.0": "NOTE-FROM-A",
              "score:0.1": "0"},
    )  # fmt: skip
    assert saved.status_code == 302
    assert "NOTE-FROM-A" in a.get(url).get_data(as_text=True)

    b = _client(app, second)
    page = b.get(url).get_data(as_text=True)
    assert "NOTE-FROM-A" not in page and "checked" not in page
    assert b.post(url, data={"score:0.0": "1"}).status_code == 400  # no CSRF token
    token = _token(page)
    b.post(url, data={"csrf_token": token, "score:0.0": "1", "score:0.1": "1"})
    bad = b.post(url, data={"csrf_token": token, "score:0.0": "5"})
    assert bad.status_code == 422
    assert b.post(url, data={"csrf_token": token, "score:9.9": "1"}).status_code == 422

    coordinator = _client(app, users[Role.COORDINATOR].email)
    stats = coordinator.get(f"/grading/agreement/{world.scoring.study_id}").get_data(as_text=True)
    assert "2 leaves graded by two or more graders (4 grades)" in stats
    assert "Agreement: 50.0%" in stats
    assert "Second Grader" in stats


def _grades_on_form(fields: dict[str, str]) -> dict[str, str]:
    """A grading form's grades and notes, as shown and as carried (not its CSRF token, which
    is made anew each second)."""
    return {name: value for name, value in fields.items() if name != "csrf_token"}


def _grades_on(page: str, url: str) -> dict[str, str]:
    return _grades_on_form(form_fields(page, url))


def test_one_snapshot_graded_in_two_tabs_keeps_both_tabs_changes(
    app: Flask, users: Users, world: World
) -> None:
    grader = _client(app, users[Role.GRADER].email)
    url = f"/grading/snapshot?snapshot={world.second}"
    first = form_fields(grader.get(url).get_data(as_text=True), url)
    first.update({"score:0.0": "1", "note:0.0": "loads it", "score:0.1": "1"})
    assert grader.post(url, data=first).status_code == 302
    tab_a = form_fields(grader.get(url).get_data(as_text=True), url)
    tab_b = dict(tab_a)
    # tab B: leaf 0.1 marked down, leaf 0.0's note rewritten
    tab_b.update({"score:0.1": "0", "note:0.0": "loads the 8x8 digits"})
    assert grader.post(url, data=tab_b).status_code == 302
    # tab A, opened before, grades leaf 0.2 only: B's changes stay
    tab_a_new = {**tab_a, "score:0.2": "0"}
    saved = grader.post(url, data=tab_a_new, follow_redirects=True)
    assert "1 grade(s) saved" in saved.get_data(as_text=True)
    now = form_fields(grader.get(url).get_data(as_text=True), url)
    assert (now["score:0.0"], now["note:0.0"]) == ("1", "loads the 8x8 digits")
    assert (now["score:0.1"], now["score:0.2"]) == ("0", "0")
    # tab A changes what B changed: refused with the value now, nothing saved
    clash = grader.post(url, data={**tab_a, "score:0.2": "1", "note:0.0": "reads the data"})
    assert clash.status_code == 409
    message = clash.get_data(as_text=True)
    assert "leaf 0.0&#39;s note (now loads the 8x8 digits)" in message, message
    assert "in another tab or window" in message
    assert _grades_on(grader.get(url).get_data(as_text=True), url) == _grades_on_form(now)
    # the refused page keeps this tab's changes over the grades as they are now: saved again,
    # knowingly, it writes those changes and leaves the other tab's (0.1) as they are
    kept = form_fields(message, url)
    assert (kept["note:0.0"], kept["shown_note:0.0"]) == ("reads the data", "loads the 8x8 digits")
    assert (kept["score:0.2"], kept["shown_score:0.2"]) == ("1", "0")
    assert kept["score:0.1"] == kept["shown_score:0.1"] == "0"
    resaved = grader.post(url, data=kept, follow_redirects=True)
    assert "2 grade(s) saved" in resaved.get_data(as_text=True)
    now = form_fields(grader.get(url).get_data(as_text=True), url)
    assert (now["note:0.0"], now["score:0.2"], now["score:0.1"]) == ("reads the data", "1", "0")
    # nothing changed, or a note on a leaf without a grade: said, not saved
    unchanged = grader.post(url, data=now)
    assert unchanged.status_code == 422 and "nothing to save" in unchanged.get_data(as_text=True)
    note_only = grader.post(url, data={**now, "note:0.3": "no grade here"})
    assert note_only.status_code == 422
    assert "leaf 0.3: choose 0 or 1" in note_only.get_data(as_text=True)
    # a script posting without the shown values changes what it sends, and only that
    assert (
        grader.post(url, data={"csrf_token": now["csrf_token"], "score:0.1": "1"}).status_code
        == 302
    )
    after = _grades_on(grader.get(url).get_data(as_text=True), url)
    assert after == _grades_on_form({**now, "score:0.1": "1", "shown_score:0.1": "1"})


def test_export_and_attempt_progress(ctx: Context, app: Flask, users: Users, world: World) -> None:
    grader = _client(app, users[Role.GRADER].email)
    url = f"/grading/snapshot?snapshot={world.first}"
    token = _token(grader.get(url).get_data(as_text=True))
    grader.post(url, data={"csrf_token": token, "score:0.0": "1", "note:0.0": "loads it"})
    from baseline.models import Grading

    with ctx.session() as session:
        grading = session.query(Grading).one()
        grading_id = grading.id
        assert grading.leaves_graded == 1 and grading.status is JobStatus.RUNNING

    coordinator = _client(app, users[Role.COORDINATOR].email)
    response = coordinator.get(f"/grading/export?grading={grading_id}")
    assert response.status_code == 200
    tree = json.loads(response.get_data(as_text=True))
    leaf = tree["sub_tasks"][0]["sub_tasks"][0]
    assert leaf["score"] == 1 and leaf["valid_score"] and leaf["explanation"] == "loads it"
    assert tree["sub_tasks"][0]["sub_tasks"][1]["score"] is None  # ungraded, not a silent 0
    assert grader.get(f"/grading/export?grading={grading_id}").status_code == 403

    progress = coordinator.get(f"/grading/attempt/{world.scoring.attempt_id}")
    text = progress.get_data(as_text=True)
    assert progress.status_code == 200
    assert "environment or dependency error" in text and "expert" in text
    assert "1/" in text  # leaves graded / total
    taken = r"(\d+ h \d\d min|\d+ min \d\d s|[\d.]+ s)"  # the snapshot's working time
    assert re.search(rf"#\d+ \w+ <span[^>]*>at {taken}</span>", text)


def test_the_grader_sees_the_files_that_matter_not_git_internals(
    ctx: Context, app: Flask, users: Users, world: World, tmp_path: Path
) -> None:
    """Issue 40 item 6: `.git` hooks and objects were listed before the real files and counted
    among them (an empty repository read as "17 files")."""
    root = tmp_path / "with-git"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    (root / ".gitignore").write_text("results/\n")
    (root / "src").mkdir()
    (root / "src" / "model.py").write_text("x = 1\n")
    (root / "reproduce.sh").write_text("python src/model.py\n")
    snapshot_id = take_snapshot(
        ctx, world.scoring.attempt_id, SnapshotKind.CHECKPOINT, 3600.0, DirectorySource(str(root))
    ).id
    page = _client(app, users[Role.GRADER].email).get(f"/grading/snapshot?snapshot={snapshot_id}")
    text = page.get_data(as_text=True)
    listed = re.findall(r"path=([^&\"]+)", text)
    assert listed == [".gitignore", "reproduce.sh", "src/model.py"], listed
    assert "3 files; the repository's <code>.git</code> internals (2 files) are not" in text


def test_the_grading_queue_is_paged_and_filtered_by_study_and_task(
    ctx: Context, app: Flask, users: Users, world: World, tmp_path: Path
) -> None:
    """Issue 40 item 6: one unpaged table of every snapshot, with no study or task filter."""
    for i in range(30):  # enough checkpoints for two pages
        snapshot_reference(
            ctx, world.scoring.attempt_id, tmp_path / f"p{i}", SnapshotKind.CHECKPOINT,
            due_working_s=3600.0 * (10 + i),
        )  # fmt: skip
    client = _client(app, users[Role.GRADER].email)
    first = client.get("/grading/").get_data(as_text=True)
    total = 30 + 3  # and the world's three snapshots of the paper task
    assert f"Rows 1\N{EN DASH}25 of {total}" in first and first.count(">Grade</a>") == 25
    second = client.get("/grading/?page=2").get_data(as_text=True)
    assert f"Rows 26\N{EN DASH}{total} of {total}" in second
    assert second.count(">Grade</a>") == total - 25
    study, task = world.scoring.study_id, world.scoring.task_id
    chosen = client.get(f"/grading/?study={study}&task={task}").get_data(as_text=True)
    assert f"of {total}" in chosen and f'<option value="{study}" selected>' in chosen
    assert "Nothing to grade yet." in client.get(f"/grading/?study={study + 999}").get_data(
        as_text=True
    )
    assert client.get("/grading/?study=abc").status_code == 422


def test_an_archived_studys_snapshots_are_not_graded_until_it_is_closed_again(
    ctx: Context, app: Flask, users: Users, world: World
) -> None:
    """An archived study is kept for the record, but its snapshots stayed in the graders' queue
    and took new grades, changing the numbers its archive and reports had given."""
    set_study_status(ctx, world.scoring.study_id, StudyStatus.ARCHIVED)
    grader = _client(app, users[Role.GRADER].email)
    assert "Nothing to grade yet." in grader.get("/grading/").get_data(as_text=True)
    url = f"/grading/snapshot?snapshot={world.second}"
    page = grader.get(url).get_data(as_text=True)  # still readable, as a record is
    assert 'id="archived-note"' in page and "Save my grades" not in page
    refused = grader.post(url, data={"csrf_token": _token(page), "score:0.0": "1"})
    assert refused.status_code == 409
    message = refused.get_data(as_text=True)
    assert "is archived: kept for the record, nothing more is run or scored for it" in message
    assert "(set it closed to grade its snapshots)" in message
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.GRADER]), "t")
    api = grader.put(
        f"/api/v1/expert-grading/snapshots/{world.second}/grades",
        headers={"Authorization": f"Bearer {token}"},
        json={"grades": [{"path": "0.0", "score": 1, "note": ""}]},
    )
    assert api.status_code == 409 and "is archived" in api.get_json()["message"]
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(Grading)) == 0
    # closed again (results kept, no new attempts), it is graded as before
    set_study_status(ctx, world.scoring.study_id, StudyStatus.CLOSED)
    assert "Nothing to grade yet." not in grader.get("/grading/").get_data(as_text=True)
    page = grader.get(url).get_data(as_text=True)
    saved = grader.post(url, data={"csrf_token": _token(page), "score:0.0": "1"})
    assert saved.status_code == 302
    # archived again, its sheet still says who graded it (it was counted over the queue only)
    set_study_status(ctx, world.scoring.study_id, StudyStatus.ARCHIVED)
    sheet = grader.get(
        f"/api/v1/expert-grading/snapshots/{world.second}",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert sheet.status_code == 200 and sheet.get_json()["snapshot"]["graders"] == 1
