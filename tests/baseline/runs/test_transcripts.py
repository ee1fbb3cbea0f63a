"""Appending transcript entries: writers of one run that race (a command agent's runner, its
model calls through the passthrough, its workspace API calls) never take the same number."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import select

from baseline.context import Context
from baseline.models import AgentRun, Task, TaskKind, TranscriptEntry, utcnow
from baseline.runs.transcripts import append_entry
from baseline.studies import studies

WRITERS = 8
ENTRIES_EACH = 25


def _agent_run(ctx: Context) -> int:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Race study"), None)
        task = Task(slug="race-task", title="T", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(session, study, "Bot", "command", "m", "http://x", None, None)
        attempt = studies.create_attempt(session, agent, task, None)
        run = AgentRun(attempt_id=attempt.id, scaffold="command", model="m", settings={})
        session.add(run)
        session.flush()
        return run.id


def test_concurrent_writers_of_one_run_get_distinct_consecutive_numbers(ctx: Context) -> None:
    run_id = _agent_run(ctx)
    start = threading.Barrier(WRITERS)
    failures: list[BaseException] = []

    def write(writer: int) -> None:
        start.wait()
        for n in range(ENTRIES_EACH):
            try:
                with ctx.session() as session:
                    append_entry(session, run_id, kind="notice", content=f"{writer}/{n}",
                                 started_at=utcnow(), ended_at=utcnow(), working_s=0.0)  # fmt: skip
            except BaseException as exc:
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    with ctx.session() as session:
        rows = session.execute(
            select(TranscriptEntry.seq, TranscriptEntry.content).where(
                TranscriptEntry.run_id == run_id
            )
        ).all()
    assert sorted(seq for seq, _ in rows) == list(range(1, WRITERS * ENTRIES_EACH + 1))
    # Each writer's own entries keep its order.
    written = [(seq, *map(int, (content or "").split("/"))) for seq, content in rows]
    for writer in range(WRITERS):
        mine = sorted((seq, n) for seq, who, n in written if who == writer)
        assert [n for _, n in mine] == list(range(ENTRIES_EACH))


def test_an_entry_takes_the_column_defaults_and_the_given_values(ctx: Context) -> None:
    run_id = _agent_run(ctx)
    at = utcnow() - timedelta(minutes=5)
    with ctx.session() as session:
        append_entry(session, run_id, kind="message", role="assistant", content="hi",
                     tool_calls=[{"id": "c1"}], started_at=at, ended_at=at,
                     working_s=12.5)  # fmt: skip
    with ctx.session() as session:
        query = select(TranscriptEntry).where(TranscriptEntry.run_id == run_id)
        entry = session.scalars(query).one()
        assert (entry.seq, entry.kind, entry.role) == (1, "message", "assistant")
        assert entry.content == "hi" and entry.tool_calls == [{"id": "c1"}]
        assert entry.ended_at == at and entry.working_s == 12.5
        assert entry.in_context is True and entry.timed_out is False
