"""Engine and session factory. SQLite gets WAL mode and foreign keys; PostgreSQL works by URL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker


class Base(DeclarativeBase):
    """Declarative base of every table."""


def rows_changed(result: object) -> int:
    """How many rows an UPDATE changed: its cursor's rowcount (`Session.execute` is typed to
    return a plain Result, which has none). What a conditional UPDATE's caller checks to know
    whether its condition held."""
    return int(getattr(result, "rowcount", 0) or 0)


# SQLite's busy handler polls a writer that finds the write lock held at growing intervals, up
# to 100 ms: a pause that long after a commit lets a waiting writer in (`commit_step`).
WRITER_TURN_S = 0.1


def commit_step(session: Session) -> None:
    """Commit one step of a loop of engine calls (reconcile's placements, the sweep's
    destroys), then, if the step wrote, give writers waiting for SQLite's write lock their turn.

    On SQLite a transaction's first write holds the database's write lock until it ends, and a
    step that writes holds it through its engine call (a placement's claim holds its row while
    the container is made). A writer that finds the lock held waits in SQLite's busy handler,
    which polls at growing intervals; a loop that takes the lock again as soon as it commits
    starves it. Committing each step alone changed nothing for such a writer: a reconcile
    placing 8 workspaces of 0.5 s each held a portal write back 4.04 s either way (a
    30-second wait fails: "database is locked"), and with this pause 0.53 s, one placement
    (benchmarks/bench_reconcile_lock.py)."""
    wrote = _holds_write_lock(session)
    session.commit()
    if wrote:
        time.sleep(WRITER_TURN_S)


def _holds_write_lock(session: Session) -> bool:
    """Whether the session's SQLite transaction has written (the driver begins one only before
    its first write); False on other databases, whose writers wait on rows, not on the file."""
    if not session.in_transaction() or session.get_bind().dialect.name != "sqlite":
        return False
    return bool(getattr(session.connection().connection.dbapi_connection, "in_transaction", False))


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    """Create an engine; a SQLite file's folder is created so a fresh machine needs no setup."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _configure_sqlite)
        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
