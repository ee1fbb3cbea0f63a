"""The statements that write, recorded: tests of work that must leave the database untouched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, event


@contextmanager
def recording_writes(engine: Engine) -> Iterator[list[str]]:
    """The INSERT, UPDATE and DELETE statements run on `engine` meanwhile, each as its first
    three words (e.g. "INSERT INTO workspaces")."""
    written: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")):
            written.append(" ".join(statement.split()[:3]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield written
    finally:
        event.remove(engine, "before_cursor_execute", record)
