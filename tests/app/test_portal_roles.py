"""What the coordinator, analyst, grader and admin pages must do (the portal walkthrough).

Coordinator: attempts list filters, sorting and paging; "Add task" offers only what can be added;
the invite form never offers "admin" to a coordinator; a 0-hour invitation is refused; durations
read as people write them; an ended attempt's missed checkpoint is not "pending"; scored-task
sentences are whole. Analyst: the tidy table as CSV/Parquet, figures as PNG/SVG, filters on a
study with no scores, readable log ticks, captions clear of axis titles, per-task axis titles.
Grader: the queue shows no timing or snapshot count that tells humans from agents. Admin: the
audit log is filtered and paged.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from datetime import timedelta

import pandas as pd
import pytest
from flask.testing import FlaskClient
from sqlalchemy import event

from analysis import plots
from analysis.seed import seed_synthetic_study
from app.formatting import byte_size, duration
from baseline import audit
from baseline.context import Context
from baseline.grading import expert_grading
from baseline.models import (
    Attempt,
    AttemptStatus,
    Invitation,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
    TaskKind,
    utcnow,
)
from baseline.studies import studies
from tests.analysis.browser import require_chromium
from tests.conftest import SeededStudy, Users, login


@dataclass
class World:
    study_id: int
    other_study_id: int
    paper_id: int
    scored_id: int
    spare_id: int
    private_id: int
    attempt_ids: list[int]


def _task(session, slug: str, kind: TaskKind = TaskKind.PAPER, **extra: object) -> Task:  # type: ignore[no-untyped-def]
    task = Task(slug=slug, title=slug.title(), kind=kind, content_hash="0" * 64, **extra)
    session.add(task)
    session.flush()
    return task


@pytest.fixture
def world(ctx: Context) -> World:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Walkthrough"), None)
        other = studies.create_study(session, studies.StudySpec(name="Other study"), None)
        paper = _task(session, "paper-a")
        scored = _task(
            session,
            "scored-b",
            TaskKind.SCORED,
            scoring={"starting_score": 0.0, "reference_score": 1.0},
        )
        spare = _task(session, "spare-c")
        private = _task(session, "synthetic-other", summary={"synthetic": True})
        for task in (paper, scored):
            studies.add_task(session, study, task, None)
        studies.add_task(session, other, private, None)
        session.flush()
        session.refresh(study)
        ids = []
        for n in range(30):
            agent = studies.add_agent(session, study, f"Agent {n:02d}", "basic", "m", "", {}, None)
            ids.append(studies.create_attempt(session, agent, paper if n % 2 else scored, None).id)
        ended = session.get(Attempt, ids[0])
        assert ended is not None
        ended.status, ended.started_at = AttemptStatus.SUBMITTED, utcnow() - timedelta(hours=1)
        ended.ended_at = utcnow()
        return World(study.id, other.id, paper.id, scored.id, spare.id, private.id, ids)


def test_attempts_list_filters_sorts_and_pages(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.COORDINATOR].email)
    first = client.get("/attempts/").get_data(as_text=True)
    assert "Rows 1\u201325 of 30" in first and "page 1 of 2" in first
    second = client.get("/attempts/?page=2").get_data(as_text=True)
    assert "Rows 26\u201330 of 30" in second
    only_paper = client.get("/attempts/?task=paper-a").get_data(as_text=True)
    assert "of 15" in only_paper and "scored-b</td>" not in only_paper
    submitted = client.get("/attempts/?status=submitted").get_data(as_text=True)
    assert f'/attempts/{world.attempt_ids[0]}"' in submitted and "of 1" in submitted
    newest_first = client.get("/attempts/?sort=id&order=desc").get_data(as_text=True)
    ids = [int(i) for i in re.findall(r'href="/attempts/(\d+)"', newest_first)]
    assert ids == sorted(ids, reverse=True) and ids[0] == max(world.attempt_ids)
    by_participant = client.get("/attempts/?sort=participant").get_data(as_text=True)
    names = re.findall(r"<td>(Agent \d\d) <span", by_participant)
    assert names == sorted(names)
    for bad in ("sort=nonsense", "page=abc", "status=lost", "study=-1"):
        response = client.get(f"/attempts/?{bad}")
        assert response.status_code == 422, bad
        assert bad.split("=")[0] in response.get_data(as_text=True)


@pytest.mark.sqlite_only("counts the portal's SQL statements, alike on both engines")
def test_attempts_list_reads_every_clock_in_a_few_queries(
    client: FlaskClient, users: Users, world: World, ctx: Context
) -> None:
    """The list's clocks, participants and snapshot counts come in one query each, not one per
    attempt (the ended attempt, one working hour, leads by working time; the one with three
    snapshots shows 3)."""
    with ctx.session() as session:
        for due in (0.0, 60.0, 120.0):
            session.add(
                Snapshot(
                    attempt_id=world.attempt_ids[1],
                    kind=SnapshotKind.INTERVAL,
                    due_working_s=due,
                    taken_working_s=due,
                    manifest_sha256="0" * 64,
                )
            )
    login(client, users[Role.COORDINATOR].email)
    statements: list[str] = []

    def note(*args: object) -> None:
        statements.append(str(args[2]))

    def page(query: str) -> str:
        statements.clear()
        event.listen(ctx.engine, "before_cursor_execute", note)
        try:
            return client.get(f"/attempts/?{query}").get_data(as_text=True)
        finally:
            event.remove(ctx.engine, "before_cursor_execute", note)

    def one_query_per_table() -> None:
        for table in ("pauses", "participants", "snapshots"):
            assert sum(f"FROM {table}" in s for s in statements) == 1, (table, statements)

    by_working = page("sort=working&order=desc")  # every row's clock, to sort by it
    one_query_per_table()
    ids = [int(i) for i in re.findall(r'href="/attempts/(\d+)"', by_working)]
    assert ids[0] == world.attempt_ids[0] and "<td>1:00:00</td>" in by_working
    by_id = page("sort=id")
    one_query_per_table()
    counts = re.findall(r"<td>(\d+)</td>\s*</tr>", by_id)
    assert len(counts) == 25 and sorted(counts)[-1] == "3" and counts.count("0") == 24, counts


def test_add_task_offers_only_addable_tasks(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{world.study_id}").get_data(as_text=True)
    offered = re.search(r'<select name="task_id" aria-label="Task to add">(.*?)</select>', page)
    assert offered is not None
    values = {int(v) for v in re.findall(r'value="(\d+)"', offered.group(1))}
    assert values == {world.spare_id}  # not the study's own, not another study's private task


def test_private_task_of_another_study_is_refused(ctx: Context, world: World) -> None:
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        task = session.get(Task, world.private_id)
        assert study is not None and task is not None
        with pytest.raises(Exception, match="private to another study"):
            studies.add_task(session, study, task, None)


def test_invite_form_offers_admin_only_to_admins(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{world.study_id}").get_data(as_text=True)
    roles = re.search(r'<select id="inv-role" name="role">(.*?)</select>', page)
    assert roles is not None and 'value="admin"' not in roles.group(1)
    assert 'value="grader"' in roles.group(1)
    login(client, users[Role.ADMIN].email)
    page = client.get(f"/studies/{world.study_id}").get_data(as_text=True)
    roles = re.search(r'<select id="inv-role" name="role">(.*?)</select>', page)
    assert roles is not None and 'value="admin"' in roles.group(1)


def test_zero_hour_invitation_is_refused(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    client.application.config["WTF_CSRF_ENABLED"] = False
    login(client, users[Role.COORDINATOR].email)
    response = client.post(
        f"/studies/{world.study_id}/invitations",
        data={"role": "participant", "ttl_hours": "0"},
        follow_redirects=True,
    )
    page = response.get_data(as_text=True)
    assert "Valid for (hours): more than 0" in page
    with ctx.session() as session:
        assert session.query(Invitation).count() == 0
    client.post(f"/studies/{world.study_id}/invitations", data={"ttl_hours": "0.5"})
    with ctx.session() as session:
        invitation = session.query(Invitation).one()
        lifetime = invitation.expires_at - invitation.created_at
        assert timedelta(minutes=29) < lifetime <= timedelta(minutes=31)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (3.25, "3.2 s"),
        (42, "42 s"),
        (59.6, "1 min"),
        (60, "1 min"),
        (900, "15 min"),
        (1313, "21 min 53 s"),
        (3600, "1 h"),
        (7199.6, "2 h"),
        (7265, "2 h 01 min"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_ended_attempt_checkpoints_are_not_pending(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{world.attempt_ids[0]}").get_data(as_text=True)
    checkpoints = page[page.index("<h2>Checkpoints</h2>") :]
    checkpoints = checkpoints[: checkpoints.index("</section>")]
    assert "pending" not in checkpoints
    assert "not taken" in checkpoints and "the attempt ended first" in checkpoints


def test_scored_task_sentences_are_whole(client: FlaskClient, users: Users, world: World) -> None:
    login(client, users[Role.COORDINATOR].email)
    detail = client.get(f"/tasks/{world.scored_id}").get_data(as_text=True)
    listing = client.get("/tasks/").get_data(as_text=True)
    for page in (detail, listing):
        assert "Script <code></code>" not in page and "( is better)" not in page
        assert "run as <code></code>" not in page and "time limit  s" not in page
    assert "Starting score 0, reference score 1." in detail
    assert "No scoring script is recorded" in detail


# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy("roles study", seed=5, fixture="synthetic")


@pytest.fixture
def synthetic(ctx: Context) -> int:
    with ctx.session() as session:
        return seed_synthetic_study(session, name="roles study", seed=5).id


def test_analyst_downloads_the_tidy_table(
    client: FlaskClient, users: Users, synthetic: int
) -> None:
    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/?study={synthetic}").get_data(as_text=True)
    assert f"/analysis/table.csv?study={synthetic}" in page
    assert f"/analysis/table.parquet?study={synthetic}" in page
    csv = client.get(f"/analysis/table.csv?study={synthetic}")
    assert csv.status_code == 200 and csv.mimetype == "text/csv"
    assert "attachment" in csv.headers["Content-Disposition"]
    parquet = client.get(f"/analysis/table.parquet?study={synthetic}")
    table = pd.read_parquet(io.BytesIO(parquet.data))
    assert len(table) == len(pd.read_csv(io.BytesIO(csv.data))) > 0
    assert client.get(f"/analysis/table.xlsx?study={synthetic}").status_code == 404
    assert client.get("/analysis/table.csv?study=abc").status_code == 422


@pytest.mark.sqlite_only("the figure files; the tidy table's download runs on both databases")
def test_analyst_downloads_figures_as_png_and_svg(
    client: FlaskClient, users: Users, synthetic: int
) -> None:
    require_chromium()
    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/?study={synthetic}").get_data(as_text=True)
    assert "/analysis/figure/trajectories.png?study=" in page
    png = client.get(f"/analysis/figure/trajectories.png?study={synthetic}")
    assert png.status_code == 200 and png.data.startswith(b"\x89PNG")
    svg = client.get(f"/analysis/figure/tasks.svg?study={synthetic}&task=")
    assert svg.status_code == 200 and b"<svg" in svg.data[:500]
    assert client.get(f"/analysis/figure/nope.png?study={synthetic}").status_code == 404
    assert client.get(f"/analysis/figure/tasks.gif?study={synthetic}").status_code == 404


def test_filters_offer_the_study_tasks_and_groups_before_any_score(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/?study={world.study_id}").get_data(as_text=True)
    tasks = re.search(r'<select name="task" id="f-task"[^>]*>(.*?)</select>', page, re.S)
    groups = re.search(r'<select name="group" id="f-group"[^>]*>(.*?)</select>', page, re.S)
    assert tasks is not None and groups is not None
    assert "paper-a" in tasks.group(1) and "scored-b" in tasks.group(1)
    assert "<option" in groups.group(1)


def test_analysts_attempts_link_leads_to_the_dashboard(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.ANALYST].email)
    response = client.get("/attempts/", follow_redirects=True)
    assert response.status_code == 200 and "<h1>Analysis</h1>" in response.get_data(as_text=True)


def test_log_ticks_are_written_out() -> None:
    assert plots.log_ticks(4, 30) == [2.0, 5.0, 10.0, 20.0, 50.0]
    assert plots.log_ticks(0.5, 2) == [0.2, 0.5, 1.0, 2.0, 5.0]


@pytest.mark.sqlite_only("the figures' layout; the dashboard's queries run on both databases")
def test_figure_layout_keeps_captions_clear_and_panels_titled(ctx: Context, synthetic: int) -> None:
    from analysis import load_study, report

    result = report.analyse(load_study(synthetic, context=ctx), report.Filters(n_boot=100))
    figures = report.figures(result)
    for name in ("trajectories", "cost"):
        layout = figures[name].layout
        ticks = [float(t) for t in layout.xaxis.tickvals]
        assert ticks and all(f"{t:g}" in layout.xaxis.ticktext for t in ticks), name
        caption = next(a for a in layout.annotations if a.yanchor == "top")
        assert caption.y == 0 and caption.yshift <= -plots.CAPTION_BELOW_AXIS_PX
        assert layout.margin.b >= plots.CAPTION_BELOW_AXIS_PX + plots.CAPTION_LINE_PX
    panels = figures["tasks"].layout
    assert panels.yaxis.title.text == "score"
    axes = [panels[k] for k in panels if k.startswith("xaxis")]
    assert axes and all(axis.title.text == "working hours (log scale)" for axis in axes)


def test_grading_queue_shows_no_timing_or_snapshot_counts(ctx: Context, world: World) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, world.attempt_ids[1])  # a paper-task attempt
        assert attempt is not None
        for kind, due in (
            (SnapshotKind.START, 0.0),
            (SnapshotKind.INTERVAL, 600.0),
            (SnapshotKind.MANUAL, 1234.0),
            (SnapshotKind.CHECKPOINT, 7200.0),
            (SnapshotKind.FINAL, 9000.0),
        ):
            session.add(
                Snapshot(
                    attempt_id=attempt.id,
                    kind=kind,
                    due_working_s=due,
                    taken_working_s=due,
                    manifest_sha256="0" * 64,
                )
            )
        session.flush()
        queue = expert_grading.gradable(session)
    assert sorted(row.checkpoint for row in queue) == ["checkpoint at 2 h", "final submission"]


def test_audit_log_filters_and_pages(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    with ctx.session() as session:
        for n in range(120):
            audit.record(session, "test.bulk", "widget", n, users[Role.ADMIN].id)
        audit.record(session, "test.single", "gadget", 7, None)
    login(client, users[Role.ADMIN].email)
    first = client.get("/admin/audit").get_data(as_text=True)
    assert "page 1 of" in first and "next \u203a" in first
    assert '<td class="nowrap">' in first  # timestamps stay on one line
    bulk = client.get("/admin/audit?action=test.bulk&page=3").get_data(as_text=True)
    assert "Rows 101\u2013120 of 120" in bulk and "test.single" not in bulk.split("<table>")[1]
    system = client.get("/admin/audit?actor=system&target=gadget").get_data(as_text=True)
    assert "Rows 1\u20131 of 1" in system and "gadget 7" in system
    today = utcnow().strftime("%Y-%m-%d")
    dated = client.get(f"/admin/audit?since={today}&until={today}&action=test.single")
    assert "Rows 1\u20131 of 1" in dated.get_data(as_text=True)
    assert client.get("/admin/audit?since=yesterday").status_code == 422
    assert client.get("/admin/audit?actor=bob").status_code == 422


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (567, "567 B"), (1023, "1023 B"), (12177, "11.9 KB"), (5 << 20, "5.0 MB"),
     (3 << 30, "3.0 GB"), (2048 << 30, "2048.0 GB")],
)  # fmt: skip
def test_sizes_read_as_people_write_them(size: int, text: str) -> None:
    assert byte_size(size) == text
