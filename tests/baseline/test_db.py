"""`db.commit_step`: a loop of engine calls commits each step and, on SQLite, after a step that
wrote, pauses long enough for a writer waiting on the database's write lock to get in (SQLite's
busy handler polls such a writer at most every 100 ms; a loop that takes the lock again at once
starves it: benchmarks/bench_reconcile_lock.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from baseline import db
from baseline.context import Context
from baseline.models import Host


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(db.time, "sleep", slept.append)
    return slept


def test_a_step_that_wrote_is_committed_and_gives_waiting_writers_a_turn_on_sqlite(
    ctx: Context, pauses: list[float]
) -> None:
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock"))
        session.flush()
        db.commit_step(session)
        assert not session.in_transaction()
    with ctx.session() as elsewhere:  # committed: another connection sees it
        assert elsewhere.scalar(select(Host.name)) == "engine"
    on_sqlite = ctx.engine.dialect.name == "sqlite"
    assert pauses == ([db.WRITER_TURN_S] if on_sqlite else [])  # PostgreSQL locks rows only
    assert db.WRITER_TURN_S >= 0.1  # the busy handler's longest poll interval


def test_a_step_that_only_read_commits_without_a_pause(ctx: Context, pauses: list[float]) -> None:
    with ctx.session() as session:
        assert session.scalar(select(Host.name)) is None
        db.commit_step(session)
        db.commit_step(session)  # no transaction at all: nothing to commit
    assert pauses == []
