"""The judge's cost estimate (issue 40): leaves x snapshots per attempt x attempts x tokens per
leaf x price, the tokens measured from the ledger once the judge has graded, and the page showing
it as an estimate with its inputs."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.jobs import orchestration
from baseline.models import (
    Grading,
    GradingKind,
    JobStatus,
    ModelCall,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
    TaskKind,
)
from baseline.studies import judge_cost, studies
from baseline.tasks import tasks
from scoring.llm import JudgeConfig, ModelPrice
from tests.conftest import Users, login

pytestmark = pytest.mark.sqlite_only("arithmetic over a few rows, not the storage")

PRICE = ModelPrice(input_usd_per_mtok=2.0, output_usd_per_mtok=8.0)
CONFIG = JudgeConfig(base_url="http://127.0.0.1:9/v1", model="judge-x", price=PRICE)


def _study(session: Session, ctx: Context, attempts: int, **spec: object) -> tuple[Study, Task]:
    study = studies.create_study(session, studies.StudySpec(name="Costed", **spec), None)  # type: ignore[arg-type]
    paper = next(
        t for t in tasks.import_demo_tasks(session, ctx.settings) if t.kind is TaskKind.PAPER
    )
    studies.add_task(session, study, paper, None)
    agent = studies.add_agent(session, study, "A", "basic", "m", "", {}, None)
    for _ in range(attempts):
        studies.create_attempt(session, agent, paper, None)
    orchestration.set_study_judge(session, study, CONFIG, False, None)
    return study, paper


def test_before_any_judge_call_it_is_an_upper_bound_from_the_context(ctx: Context) -> None:
    with ctx.session() as session:
        study, paper = _study(session, ctx, attempts=3, snapshot_interval_minutes=600.0,
                              working_time_limit_hours=20.0)  # fmt: skip
        got = judge_cost.estimate(session, study, CONFIG, code_dev=False)
        leaves = paper.summary["leaves"]
    assert leaves > 0
    # start + checkpoints 2 and 8 (32 and 48 lie past the 20 h limit) + 2 interval snapshots + final
    assert got.snapshots_per_attempt == 6
    prompt = (128_000 - 8_192) * (1 + 1 / 20)  # a full context, plus a ranking call's share
    per_leaf = (prompt * 2.0 + 8_192 * 8.0) / 1e6
    assert not got.measured and got.tokens_from.startswith("at most")
    [task] = got.tasks
    assert (task.leaves, task.attempts) == (leaves, 3)
    assert got.usd == pytest.approx(leaves * 6 * 3 * per_leaf)


def test_the_ledger_gives_the_tokens_per_leaf_once_the_judge_has_graded(ctx: Context) -> None:
    with ctx.session() as session:
        study, paper = _study(session, ctx, attempts=2)
        attempt = study.participants[0].attempts[0]
        snapshot = Snapshot(attempt=attempt, kind=SnapshotKind.START, due_working_s=0,
                            taken_working_s=0, manifest_sha256="0" * 64)  # fmt: skip
        grading = Grading(snapshot=snapshot, kind=GradingKind.JUDGE, status=JobStatus.SUCCEEDED,
                          leaves_graded=10)  # fmt: skip
        session.add_all([snapshot, grading])
        session.flush()
        for purpose, prompt, completion in (("judge_rank", 10_000, 1_000),
                                            ("judge_grade", 40_000, 4_000)):  # fmt: skip
            session.add(ModelCall(study_id=study.id, attempt_id=attempt.id, grading_id=grading.id,
                                  purpose=purpose, model="judge-x", prompt_tokens=prompt,
                                  completion_tokens=completion))  # fmt: skip
        session.add(ModelCall(study_id=study.id, attempt_id=attempt.id, purpose="agent",
                              model="m", prompt_tokens=10**9))  # fmt: skip
        session.flush()
        got = judge_cost.estimate(session, study, CONFIG, code_dev=False)
        code_dev = judge_cost.estimate(session, study, CONFIG, code_dev=True)
        leaves = paper.summary["leaves"]
        code_leaves = paper.summary["leaves_by_category"]["Code Development"]
    assert got.measured and "10 leaves in 1 gradings" in got.tokens_from
    assert (got.prompt_tokens_per_leaf, got.completion_tokens_per_leaf) == (5_000, 500)
    assert got.usd == pytest.approx(leaves * 6 * 2 * (5_000 * 2.0 + 500 * 8.0) / 1e6)
    assert code_dev.tasks[0].leaves == code_leaves < leaves


def test_the_study_page_shows_the_estimate_and_its_inputs(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    with ctx.session() as session:
        study, paper = _study(session, ctx, attempts=1)
        study_id, leaves = study.id, paper.summary["leaves"]
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    section = re.search(r'<div id="judge-cost">(.*?)</div>', page, re.S)
    assert section, page
    text = re.sub(r"<[^>]+>", "", section.group(1))
    assert "Estimated judge cost:" in text and "at most for the 1 attempts created" in text
    assert "An estimate: leaves per rubric \u00d7 6 snapshots per attempt" in text
    assert "$2 in, $8 out per million tokens (judge-x" in text
    assert f"digits-baselines{leaves}" in text.replace("\n", "")
