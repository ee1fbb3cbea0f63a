"""An archived study is kept for the record: nothing more is reproduced, judged or scored for it,
whoever asks (the worker passes it over; a command asking for it is refused by name), until a
coordinator sets it closed again."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from baseline.context import Context
from baseline.errors import Conflict
from baseline.grading.reproductions import queue_reproduction
from baseline.jobs import orchestration
from baseline.models import Reproduction, Snapshot, Study, StudyStatus
from scoring.llm import JudgeConfig
from tests.scoring.scoring_world import build_world, set_study_status, snapshot_reference

pytestmark = pytest.mark.sqlite_only("which work is refused, decided before any is stored")

JUDGE = JudgeConfig(base_url="http://127.0.0.1:9/v1", model="gpt-4.1-mini")


def test_nothing_is_run_or_scored_for_an_archived_study_until_it_is_closed(
    ctx: Context, tmp_path: Path
) -> None:
    """`baseline reproduce` ran an archived study's snapshot, `baseline rescore` queued gradings
    the worker never took up (shown as queued for ever), and its judge could be changed."""
    world = build_world(ctx)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "s")
    set_study_status(ctx, world.study_id, StudyStatus.ARCHIVED)
    asked = {
        "reproduce its snapshots": lambda session: queue_reproduction(
            session, session.get(Snapshot, snapshot_id)
        ),
        "change its judge": lambda session: orchestration.set_study_judge(
            session, session.get(Study, world.study_id), JUDGE, False, None
        ),
    }
    for what, ask in asked.items():
        with (
            pytest.raises(Conflict, match=f"is archived: .*set it closed to {what}"),
            ctx.session() as session,
        ):
            ask(session)
    with pytest.raises(Conflict, match="set it closed to judge its snapshots again"):
        orchestration.rescore(ctx, world.study_id, JUDGE, False, None)
    with pytest.raises(Conflict, match="set it closed to score its attempts"):
        orchestration.process_queue(ctx, attempt_id=world.attempt_id)
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(Reproduction)) == 0
        study = session.get(Study, world.study_id)
        assert study is not None and orchestration.study_judge(study) is None
    # closed again (results kept, no new attempts), its snapshots are reproduced and judged
    set_study_status(ctx, world.study_id, StudyStatus.CLOSED)
    with ctx.session() as session:
        for ask in asked.values():
            ask(session)
    assert orchestration.rescore(ctx, world.study_id, JUDGE, False, None)
