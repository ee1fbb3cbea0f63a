"""Seed the demo study: accounts for every role and a study to look at."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.config import Settings
from baseline.models import Role, Study, User
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks

DEMO_STUDY = "Demo study"
DEMO_USERS = {
    Role.ADMIN: "admin@example.org",
    Role.COORDINATOR: "coordinator@example.org",
    Role.GRADER: "grader@example.org",
    Role.ANALYST: "analyst@example.org",
    Role.PARTICIPANT: "participant@example.org",
}


@dataclass
class DemoInfo:
    study_id: int
    credentials: dict[str, tuple[str, str]]


def _credentials_file(settings: Settings) -> Path:
    return settings.home / "demo-credentials.json"


def _load_credentials(settings: Settings) -> dict[str, str]:
    path = _credentials_file(settings)
    if path.exists():
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    return {}


def _save_credentials(settings: Settings, passwords: dict[str, str]) -> None:
    path = _credentials_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(passwords, handle)
    os.replace(tmp, path)


def seed_demo(session: Session, settings: Settings) -> DemoInfo:
    """Create what is missing; running it twice changes nothing and prints the same logins."""
    passwords = _load_credentials(settings)
    credentials: dict[str, tuple[str, str]] = {}
    users: dict[Role, User] = {}
    for role, email in DEMO_USERS.items():
        user = session.scalar(select(User).where(User.email == email))
        if user is None:
            password = passwords.get(email) or secrets.token_urlsafe(9)
            user = accounts.create_user(session, email, f"Demo {role.value}", password, role)
            passwords[email] = password
        users[role] = user
        credentials[role.value] = (email, passwords.get(email, "(set earlier, not stored)"))
    _save_credentials(settings, passwords)

    study = session.scalar(select(Study).where(Study.name == DEMO_STUDY))
    if study is None:
        study = studies.create_study(
            session,
            studies.StudySpec(
                name=DEMO_STUDY,
                description="A demo study: the bundled digits task and its scored twin.",
                checkpoint_hours=(2, 8, 32, 48),
                time_scale=3600.0,
            ),
            actor_id=users[Role.ADMIN].id,
        )
        studies.enroll_human(session, study.id, users[Role.PARTICIPANT], actor_id=None)
    attached = {task.id for task in studies.study_tasks(session, study)}
    for task in tasks.import_demo_tasks(session, settings):
        if task.id not in attached:
            studies.add_task(session, study, task, actor_id=users[Role.ADMIN].id)
    return DemoInfo(study_id=study.id, credentials=credentials)
