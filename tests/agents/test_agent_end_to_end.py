"""Acceptance: built-in agents attempt the demo paper task in real Docker workspaces.

The fake OpenAI server answers with tool calls. The basic agent reads the paper, writes code and a
reproduce.sh into the submission, runs it, commits and ends the task; the iterative agent works
under a time-scaled 2-hour budget until its time runs out. Their checkpoints are taken, every
snapshot is reproduced in a fresh workspace and judged (another fake endpoint), and the agents'
scores land in the study's results table beside a human's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import func, select

from analysis import report
from analysis.archive import archive_study
from analysis.table import build_table, load_from_session
from baseline.archive.importer import import_archive
from baseline.archive.manifest import ArchiveOptions
from baseline.archive.reader import open_archive
from baseline.attempts.snapshots import store_for
from baseline.config import Settings
from baseline.context import Context
from baseline.jobs import orchestration
from baseline.models import (
    AgentRunStatus,
    AttemptStatus,
    ModelCall,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
)
from baseline.people import accounts
from baseline.runs.agent_runs import AgentLoop
from baseline.runs.transcripts import export_jsonl, run_of
from baseline.studies import studies
from tests.agents.agent_world import (
    AGENT_MODEL,
    Script,
    agent_attempt,
    attempt,
    bash,
    call,
    cleanup,
    entries,
    factory,
)
from tests.analysis import archive_world
from tests.docker_env import test_image
from tests.fake_openai import FakeOpenAI, Reply
from tests.scoring.judge_support import config
from tests.scoring.scoring_world import snapshot_reference
from tests.test_end_to_end import judge_answer

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]

SOLVE = """import json, os
os.makedirs("results", exist_ok=True)
json.dump({"lr_accuracy": 0.96}, open("results/metrics.json", "w"))
print("train 1347 images")
"""
REPRODUCE = '#!/usr/bin/env bash\nset -euo pipefail\ncd "$(dirname "$0")"\npython3 solve.py\n'


def _write(path: str, text: str) -> str:
    return f"cat > {path} <<'EOF'\n{text}EOF\n"


def _judge_and_table(ctx: Context, study_id: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("FAKE_JUDGE_KEY", "not-a-real-key")
    with FakeOpenAI(answer=judge_answer) as judge_server:
        judge = config(judge_server.base_url, api_key_env="FAKE_JUDGE_KEY")
        with ctx.session() as session:
            study = session.get(Study, study_id)
            assert study is not None
            orchestration.set_study_judge(session, study, judge, code_dev=False, actor_id=None)
        report = orchestration.process_queue(ctx, backend_factory=factory)
        assert report.errors == []
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        return build_table(session, study)


def test_basic_agent_solves_reproduces_and_is_graded_beside_a_human(
    ctx: Context,
    cleanup: None,
    test_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_sqlite: Path,
) -> None:
    script = Script(
        [
            call("read_file_chunk", file="/home/paper/paper.md", start_line=1, max_lines=20),
            bash(_write("solve.py", SOLVE) + _write("reproduce.sh", REPRODUCE)),
            bash("bash reproduce.sh && git add -A && git commit -qm 'reproduce the paper'"),
            call("search_file", file="results", query="lr_accuracy"),
            call("python", code="print(open('/home/submission/results/metrics.json').read())"),
            Reply(content="The submission is ready."),
            call("end_task", message="done"),
        ]
    )
    # 0.4 s a call at 3600x: the 2-hour checkpoint falls due while the agent works.
    with FakeOpenAI(answer=script, latency_s=0.4) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    assert outcome.end_reason == "the agent ended the task" and outcome.steps == 7

    # The tools ran in the workspace: each reply the model got shows the command's effect.
    tool_replies = [e for e in entries(ctx, world.attempt_id) if e.role == "tool"]
    assert "1:# " in (tool_replies[0].content or "")  # numbered lines of paper.md
    assert "train 1347 images" in (tool_replies[2].content or "")
    assert tool_replies[2].exit_code == 0
    assert "results/metrics.json:1:" in (tool_replies[3].content or "")
    assert '"lr_accuracy": 0.96' in (tool_replies[4].content or "")
    rows = entries(ctx, world.attempt_id)
    texts = [e.content or "" for e in rows if e.role == "user"]
    assert any("Please continue working" in t for t in texts)  # the text-only reply
    assert any("Time used:" in t and "commit your work" in t for t in texts)  # step 5 reminder
    # The model was offered every basic tool.
    offered = {t["function"]["name"] for t in script.bodies[0]["tools"]}
    assert offered == {"bash", "python", "read_file_chunk", "search_file", "end_task"}

    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.SUBMITTED
    kinds = [s.kind for s in done.snapshots]
    assert SnapshotKind.START in kinds and SnapshotKind.FINAL in kinds
    assert SnapshotKind.CHECKPOINT in kinds  # the 2 h checkpoint, taken during the run

    # Cost ledger: one row per model call, priced.
    with ctx.session() as session:
        calls = session.scalar(
            select(func.count())
            .select_from(ModelCall)
            .where(ModelCall.attempt_id == world.attempt_id, ModelCall.purpose == "agent")
        )
        run = run_of(session, world.attempt_id)
        assert run is not None and calls == 7 and run.cost_usd > 0
        assert run.settings["model"]["input_usd_per_mtok"] == 2.0
        assert run.settings["generation_counts"] is True
    lines = export_jsonl_lines(ctx, world.attempt_id)
    assert lines[0]["scaffold"] == "basic" and len(lines) == len(rows) + 1

    # A human's submission of the same task, for the comparison.
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        task = session.get(Task, world.task_id)
        assert study is not None and task is not None
        user = accounts.create_user(
            session,
            "hortense.quill@test.example",
            "Hortense Quill",
            "password123",
            Role.PARTICIPANT,
        )
        human = studies.create_attempt(
            session, studies.enroll_human(session, study.id, user, None), task, None
        )
        human.status = AttemptStatus.SUBMITTED
        human.image_digest = done.image_digest  # the same workspace image as the agent's
        human_id = human.id
    snapshot_reference(ctx, human_id, tmp_path / "human")

    table = _judge_and_table(ctx, world.study_id, monkeypatch)
    agent_rows = table[table["group"] == f"basic:{AGENT_MODEL}"]
    human_rows = table[table["group"] == "human"]
    final = agent_rows[agent_rows["snapshot_kind"] == "final"]
    # The scripted judge credits a leaf whose prompt shows what only the reproduction produced.
    assert len(final) == 1 and 0 < final["score"].iloc[0] <= 1
    assert final["reproduction_status"].tolist() == ["succeeded"]
    assert final["api_cost_usd"].iloc[0] > 0
    human_final = human_rows[human_rows["snapshot_kind"] == "final"]
    assert human_final["score"].tolist() == [1.0], human_final["missing"].tolist()
    _archived_and_imported_gives_the_same_numbers(ctx, world.study_id, tmp_path, migrated_sqlite)


def _archived_and_imported_gives_the_same_numbers(
    ctx: Context, study_id: int, tmp_path: Path, migrated_sqlite: Path
) -> None:
    """Issue 33: the study just run (time-scaled, an agent and a human, reproduced and judged),
    archived and imported into a fresh home (on SQLite, whatever the source's database): the
    same table, agreement and summaries, and no person's name or e-mail in the archive."""
    path = tmp_path / "study.tar"
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        archive_study(session, store_for(ctx), study, path, ArchiveOptions())
        before = load_from_session(session, study)
    raw = path.read_bytes()
    assert b"hortense.quill" not in raw and b"Hortense Quill" not in raw
    home = tmp_path / "second-home"
    home.mkdir()
    shutil.copyfile(migrated_sqlite, home / "db.sqlite")
    second = Context.from_settings(
        Settings(home=home, database_url=f"sqlite:///{home / 'db.sqlite'}", secret_key="t")
    )
    try:
        with open_archive(path) as archive, second.session() as session:
            imported = import_archive(session, store_for(second), archive)
        with second.session() as session:
            copy = session.get(Study, imported.study_id)
            assert copy is not None
            after = load_from_session(session, copy)
    finally:
        second.engine.dispose()
    assert len(before.table) > 0 and before.table["score"].notna().any()
    pd.testing.assert_frame_equal(
        after.table, archive_world.mapped_ids(before.table, imported.ids), check_exact=True
    )
    ours, theirs = report.analyse(before), report.analyse(after)
    for name in report.SUMMARIES:
        pd.testing.assert_frame_equal(
            report.summary(theirs, name), report.summary(ours, name), check_exact=True
        )


def export_jsonl_lines(ctx: Context, attempt_id: int) -> list[dict[str, Any]]:
    with ctx.session() as session:
        return [json.loads(line) for line in export_jsonl(session, attempt_id).splitlines()]


@pytest.mark.sqlite_only(
    "the agent's loop and its clock; the basic agent's test runs on both databases"
)
def test_iterative_agent_works_until_its_two_hours_are_up(
    ctx: Context, cleanup: None, test_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = iter(range(10**6))

    def step(body: dict[str, Any]) -> Reply:
        n = next(counter)
        if n == 0:
            return bash(_write("solve.py", SOLVE) + _write("reproduce.sh", REPRODUCE))
        if n % 3 == 2:
            return Reply(content="Thinking about the next experiment.")
        return bash(f"echo step-{n} >> notes.txt && git add -A && git commit -qm step-{n}")

    script = Script([step])
    # 2 working hours at 720x: 10 wall seconds; a checkpoint at 1 h.
    with FakeOpenAI(answer=script, latency_s=0.2) as server:
        world = agent_attempt(
            ctx, test_image, server.base_url, scaffold="iterative", time_scale=720.0,
            limit_hours=2.0, checkpoints=(1.0,), name="iterative study",
        )  # fmt: skip
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    assert outcome.end_reason == "attempt ended"
    offered = {t["function"]["name"] for t in script.bodies[0]["tools"]}
    assert offered == {"bash", "read_file_chunk"}
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.ENDED and done.end_reason == "working-time limit reached"
    kinds = {s.kind: s for s in done.snapshots}
    assert {SnapshotKind.START, SnapshotKind.CHECKPOINT, SnapshotKind.FINAL} <= set(kinds)
    assert kinds[SnapshotKind.CHECKPOINT].due_working_s == 3600.0
    rows = entries(ctx, world.attempt_id)
    told = [e.seq for e in rows if e.role == "user" and (e.content or "").startswith("Continue")]
    assert told, "the model never answered without a tool call"
    # It kept going after being told to continue, until the clock ended the attempt.
    assert any(e.role == "assistant" and e.seq > told[0] for e in rows)
    assert outcome.steps >= 4

    table = _judge_and_table(ctx, world.study_id, monkeypatch)
    rows = table[table["group"] == f"iterative:{AGENT_MODEL}"]
    final = rows[rows["snapshot_kind"] == "final"]
    assert final["reproduction_status"].tolist() == ["succeeded"]
    assert len(final) == 1 and 0 < final["score"].iloc[0] <= 1
    with ctx.session() as session:
        assert session.execute(select(func.count()).select_from(Snapshot)).scalar_one() >= 3
