"""Task pages: staff see the rubric tree; participants see only the paper of their own studies."""

from __future__ import annotations

from flask.testing import FlaskClient

from baseline import studies, tasks
from baseline.context import Context
from baseline.models import Role
from tests.conftest import Users, login


def _demo(ctx: Context, users: Users, enrol: bool) -> tuple[int, int]:
    with ctx.session() as session:
        paper, scored = tasks.import_demo_tasks(session, ctx.settings)
        study = studies.create_study(session, studies.StudySpec(name="Pages"), None)
        studies.add_task(session, study, paper, None)
        if enrol:
            studies.enroll_human(session, study.id, session.merge(users[Role.PARTICIPANT]), None)
        return paper.id, scored.id


def test_coordinator_sees_list_and_rubric_tree(
    client: FlaskClient, ctx: Context, users: Users
) -> None:
    paper_id, scored_id = _demo(ctx, users, enrol=False)
    login(client, users[Role.COORDINATOR].email)
    listing = client.get("/tasks/").get_data(as_text=True)
    assert "digits-baselines" in listing and "22 leaves, 30 nodes" in listing
    assert "start 0.8556" in listing
    page = client.get(f"/tasks/{paper_id}").get_data(as_text=True)
    assert page.count("<details") == 8  # the internal nodes of the demo rubric
    assert "22 leaves" in page and "Result Analysis" in page and "w 2" in page
    assert "within one percentage point of 96.9%" in page  # a leaf requirement
    assert "rubric.json" in page and "hidden" in page
    scored = client.get(f"/tasks/{scored_id}").get_data(as_text=True)
    assert "higher is better" in scored and "protected/split.json" in scored


def test_grader_sees_the_rubric_too(client: FlaskClient, ctx: Context, users: Users) -> None:
    paper_id, _ = _demo(ctx, users, enrol=False)
    login(client, users[Role.GRADER].email)
    assert client.get(f"/tasks/{paper_id}").status_code == 200


def test_participant_sees_the_paper_but_never_the_rubric(
    client: FlaskClient, ctx: Context, users: Users
) -> None:
    paper_id, scored_id = _demo(ctx, users, enrol=True)
    login(client, users[Role.PARTICIPANT].email)
    assert client.get("/tasks/").status_code == 403
    assert client.get(f"/tasks/{paper_id}").status_code == 403
    response = client.get(f"/tasks/{paper_id}/paper")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "Small Models, Solid Digits" in page and "Addendum" in page
    assert "within one percentage point of 96.9%" not in page  # rubric text
    assert "Notes for the judge" not in page  # judge addendum
    assert "reproduce.py" not in page  # the reference submission is never imported
    # A task of a study the participant is not enrolled in does not exist for them.
    assert client.get(f"/tasks/{scored_id}/paper").status_code == 404
    assert client.get("/tasks/99999/paper").status_code == 404


def test_not_enrolled_participant_gets_404(client: FlaskClient, ctx: Context, users: Users) -> None:
    paper_id, _ = _demo(ctx, users, enrol=False)
    login(client, users[Role.PARTICIPANT].email)
    assert client.get(f"/tasks/{paper_id}/paper").status_code == 404


def test_the_paper_is_rendered_and_raw_html_in_it_is_not(
    client: FlaskClient, ctx: Context, users: Users
) -> None:
    paper_id, _ = _demo(ctx, users, enrol=True)
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/tasks/{paper_id}/paper").get_data(as_text=True)
    assert "<h1>Small Models, Solid Digits" in page  # Markdown, not a <pre> of its source
    assert "<h2>Abstract</h2>" in page and "# Small Models" not in page
    from app.blueprints.tasks import _markdown

    rendered = str(_markdown("# T\n\n<script>alert(1)</script>\n\n| a | b |\n|---|---|\n| 1 | 2 |"))
    assert "<script>" not in rendered and "&lt;script&gt;" in rendered
    assert "<table>" in rendered
