"""Task pages: staff see the rubric tree; participants see only the paper of their own studies."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from flask.testing import FlaskClient

from baseline.context import Context
from baseline.models import Role
from baseline.studies import studies
from baseline.tasks import tasks
from infra.blobs import BlobStore
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
    assert "start 0.855556" in listing
    page = client.get(f"/tasks/{paper_id}").get_data(as_text=True)
    assert page.count("<details") == 8  # the internal nodes of the demo rubric
    assert "22 leaves" in page and "Result Analysis" in page and "w 2" in page
    assert "within one percentage point of 96.9%" in page  # a leaf requirement
    assert "rubric.json" in page and "hidden" in page
    rubric_size = re.search(r"rubric\.json</code></td>.*?<td>([^<]*)</td>", page, re.S)
    assert rubric_size is not None and re.fullmatch(r"\d+\.\d KB", rubric_size[1]), rubric_size
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


def _scored_study(ctx: Context, users: Users) -> tuple[int, int, int, int]:
    """Both demo tasks in one study, the participant enrolled with an attempt on the paper."""
    with ctx.session() as session:
        paper, scored = tasks.import_demo_tasks(session, ctx.settings)
        study = studies.create_study(session, studies.StudySpec(name="Both"), None)
        studies.add_task(session, study, paper, None)
        studies.add_task(session, study, scored, None)
        participant = studies.enroll_human(
            session, study.id, session.merge(users[Role.PARTICIPANT]), None
        )
        attempt = studies.create_attempt(session, participant, paper, None)
        return paper.id, scored.id, attempt.id, study.id


def test_task_view_has_paper_addendum_blacklist_and_resources(
    client: FlaskClient, ctx: Context, users: Users
) -> None:
    paper_id, _, _, _ = _scored_study(ctx, users)
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/tasks/{paper_id}/paper").get_data(as_text=True)
    sections = ['id="paper"', 'id="addendum"', 'id="blacklist"', 'id="resources"']
    positions = [page.index(s) for s in sections]
    assert positions == sorted(positions)  # the paper first, the resources last
    assert "<h1>Addendum</h1>" in page and "no download is needed or allowed" in page
    assert "Notes for the judge" not in page  # the judge's addendum stays hidden
    blacklist = page[page.index('id="blacklist"') : page.index('id="resources"')]
    assert "<li><code>https://github.com/baseline-demo/digits-baselines</code></li>" in blacklist
    assert "# Sites a participant" not in blacklist  # parsed, not the raw file
    resources = page[page.index('id="resources"') :]
    assert f'href="/tasks/{paper_id}/files/config.yaml"' in resources
    assert "/home/paper/config.yaml" in resources
    assert "rubric.json" not in page and "judge.addendum" not in page

    # A resource downloads, as text that is never run as a page; hidden files do not exist.
    config = client.get(f"/tasks/{paper_id}/files/config.yaml")
    assert config.status_code == 200 and config.mimetype == "text/plain"
    assert b"digits-baselines" in config.data
    for hidden in ("rubric.json", "judge.addendum.md", "nothing-here.txt", "../rubric.json"):
        assert client.get(f"/tasks/{paper_id}/files/{hidden}").status_code == 404, hidden


def test_scored_task_view_has_instructions_and_starting_files_not_the_scorer(
    client: FlaskClient, ctx: Context, users: Users
) -> None:
    _, scored_id, _, _ = _scored_study(ctx, users)
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/tasks/{scored_id}/paper").get_data(as_text=True)
    assert 'id="instructions"' in page and "<h1>Improve a digits classifier</h1>" in page
    assert f'href="/tasks/{scored_id}/files/starting/solution.py"' in page
    assert "score.py" not in page and "split.json" not in page and "task.yaml" not in page
    assert client.get(f"/tasks/{scored_id}/files/starting/solution.py").status_code == 200
    assert client.get(f"/tasks/{scored_id}/files/scoring/score.py").status_code == 404
    assert client.get(f"/tasks/{scored_id}/files/protected/split.json").status_code == 404


def test_a_paper_image_points_at_the_task_files() -> None:
    from app.blueprints.tasks import _markdown

    html = str(
        _markdown(
            "![fig](assets/fig1.png) [site](https://e.org/x) [sec](#s) [root](/x) [a](b.md)",
            "/tasks/7/files/",
        )
    )
    assert 'src="/tasks/7/files/assets/fig1.png"' in html
    assert 'href="/tasks/7/files/b.md"' in html
    assert 'href="https://e.org/x"' in html and 'href="#s"' in html and 'href="/x"' in html


def test_task_names_are_links(client: FlaskClient, ctx: Context, users: Users) -> None:
    paper_id, scored_id, attempt_id, study_id = _scored_study(ctx, users)
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    for task_id in (paper_id, scored_id):
        assert f'href="/tasks/{task_id}/paper"' in page
    listing = client.get("/attempts/").get_data(as_text=True)
    assert f'href="/tasks/{paper_id}/paper">digits-baselines</a>' in listing
    attempt = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    assert f'href="/tasks/{paper_id}/paper">digits-baselines</a>' in attempt
    client.post("/logout", data={"csrf_token": _csrf(attempt)})
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert f'href="/tasks/{paper_id}"' in page and f'href="/tasks/{scored_id}"' in page


def _csrf(page: str) -> str:
    import re

    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    return found.group(1)


def test_paper_assets_show_and_an_svg_is_only_downloaded(
    client: FlaskClient, ctx: Context, users: Users, tmp_path: Path
) -> None:
    folder = tmp_path / "figures-paper"
    source = tasks.DEMO_TASKS_DIR / "digits-baselines"
    folder.mkdir()
    for name in ("rubric.json", "addendum.md", "blacklist.txt"):
        shutil.copy(source / name, folder / name)
    (folder / "config.yaml").write_text("id: figures-paper\ntitle: Figures\n")
    (folder / "paper.md").write_text("# Figures\n\n![curve](assets/curve.png)\n")
    (folder / "assets").mkdir()
    (folder / "assets" / "curve.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 64)
    (folder / "assets" / "logo.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    with ctx.session() as session:
        task = tasks.import_task(session, BlobStore(ctx.settings.blob_dir), folder).task
        study = studies.create_study(session, studies.StudySpec(name="Figures"), None)
        studies.add_task(session, study, task, None)
        studies.enroll_human(session, study.id, session.merge(users[Role.PARTICIPANT]), None)
        task_id = task.id
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/tasks/{task_id}/paper").get_data(as_text=True)
    assert f'src="/tasks/{task_id}/files/assets/curve.png"' in page
    png = client.get(f"/tasks/{task_id}/files/assets/curve.png")
    assert png.status_code == 200 and png.mimetype == "image/png"
    assert "Content-Disposition" not in png.headers
    svg = client.get(f"/tasks/{task_id}/files/assets/logo.svg")
    assert svg.status_code == 200
    assert svg.headers["Content-Disposition"] == 'attachment; filename="logo.svg"'
