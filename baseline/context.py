"""The running context of the domain: settings, engine and session factory, made once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from baseline.config import Settings, load_settings
from baseline.db import make_engine, make_session_factory, session_scope


@dataclass
class Context:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Context:
        settings = settings or load_settings()
        engine = make_engine(settings.database_url)
        return cls(settings=settings, engine=engine, sessions=make_session_factory(engine))

    @contextmanager
    def session(self) -> Iterator[Session]:
        with session_scope(self.sessions) as session:
            yield session
