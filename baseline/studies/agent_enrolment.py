"""Enrolling an agent configuration into a study with N runs per task.

An agent configuration is a scaffold (a built-in one; ``command``: an external agent program run
in the workspace, `agents.command`; or ``api``: an agent running elsewhere that drives its
attempts through the API with their tokens, so no worker runs it), a model, its endpoint and its
settings (prices, limits, whether generation time counts: `agents.settings`; a command agent's
command, version and environment). Enrolment validates all of it up front, so a
run never fails hours later on a typo, and creates N attempts per task of the study (best-of-k
needs k independent runs). The attempts are ordinary attempts: they launch like a human's and
appear in the same tables and plots, grouped by the configuration.

Groups: the tables, curves and best-of-k group agents by the group their coordinator names
(default ``scaffold:model``), shown beside the hash of the enrolment's full settings. Two
enrolments with different settings (``token_limit=500`` beside ``generation_counts=false``) were
pooled into one scaffold:model group unasked; now a group holds one configuration's settings,
and an enrolment whose settings differ from its group's is refused unless pooling is asked for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import command as command_agents
from agents import scaffold as scaffolds
from agents.settings import SettingsError, from_flat
from baseline import audit
from baseline.errors import Conflict, InvalidInput
from baseline.models import Participant, ParticipantKind, Study
from baseline.studies import studies

MAX_RUNS_PER_TASK = 100
API_SCAFFOLD = "api"  # driven from outside through the API; Baseline runs nothing for it


@dataclass(frozen=True)
class Enrolment:
    participant: Participant
    attempt_ids: list[int]


def settings_hash(participant: Participant) -> str:
    """The first 12 hex digits of the sha256 of an agent configuration: scaffold, model, endpoint
    and every setting (canonical JSON), what tells two configurations in one group apart."""
    config = {
        "scaffold": participant.agent_scaffold, "model": participant.agent_model,
        "endpoint": participant.agent_endpoint, "settings": participant.agent_limits or {},
    }  # fmt: skip
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def assign_group(
    session: Session, participant: Participant, group: str | None, *, pool: bool,
    actor_id: int | None,
) -> str:  # fmt: skip
    """Put a new agent participant in the group `group` (default ``scaffold:model``). A group
    holding another configuration (another settings hash) is refused unless `pool`: pooling
    different settings is the coordinator's explicit choice, and is audited."""
    name = (group or "").strip() or f"{participant.agent_scaffold}:{participant.agent_model}"
    if len(name) > 200 or name == "human":
        raise InvalidInput(f"group: {name[:50]!r} is not a usable name (1-200 characters, "
                           "not 'human')")  # fmt: skip
    own = settings_hash(participant)
    agents = session.scalars(
        select(Participant).where(
            Participant.study_id == participant.study_id,
            Participant.kind == ParticipantKind.AGENT,
            Participant.id != participant.id,
        )
    )
    others = sorted({settings_hash(p) for p in agents if p.group == name} - {own})
    if others and not pool:
        raise Conflict(
            f"group {name!r} holds an agent configuration with other settings (settings "
            f'{", ".join(others)}; this one {own}): name this one\'s group (--group, "group") '
            'or pool them explicitly (--pool, "pool": true)'
        )
    participant.agent_group = name
    if others:
        audit.record(session, "participant.pool_group", "participant", participant.id, actor_id,
                     group=name, settings_hash=own, pooled_with=others)  # fmt: skip
    return name


def add_configuration(
    session: Session,
    study: Study,
    *,
    name: str,
    scaffold: str,
    model: str,
    endpoint: str,
    settings: dict[str, Any],
    actor_id: int | None,
    group: str | None = None,
    pool: bool = False,
) -> Participant:
    """The agent participant of a validated configuration, in its group, without attempts (the
    coordinator creates them one by one, or `enrol` N per task)."""
    known = [*scaffolds.names(), command_agents.SCAFFOLD, API_SCAFFOLD]
    if scaffold not in known:
        raise InvalidInput(f"scaffold: unknown {scaffold!r}; known: {', '.join(known)}")
    try:
        if scaffold == command_agents.SCAFFOLD:
            command_agents.command_from_flat(endpoint, model, settings)
        elif scaffold != API_SCAFFOLD:
            from_flat(endpoint, model, settings)
    except SettingsError as exc:
        raise InvalidInput(str(exc)) from exc
    participant = studies.add_agent(
        session, study, name, scaffold, model, endpoint, dict(settings), actor_id
    )
    assign_group(session, participant, group, pool=pool, actor_id=actor_id)
    return participant


def enrol(
    session: Session,
    study: Study,
    *,
    name: str,
    scaffold: str,
    model: str,
    endpoint: str,
    settings: dict[str, Any],
    runs_per_task: int,
    actor_id: int | None,
    group: str | None = None,
    pool: bool = False,
) -> Enrolment:
    if not 1 <= runs_per_task <= MAX_RUNS_PER_TASK:
        raise InvalidInput(f"runs_per_task: must be from 1 to {MAX_RUNS_PER_TASK}")
    if not study.tasks:
        raise InvalidInput(f"study {study.name!r} has no tasks to run the agent on")
    participant = add_configuration(
        session, study, name=name, scaffold=scaffold, model=model, endpoint=endpoint,
        settings=settings, actor_id=actor_id, group=group, pool=pool,
    )  # fmt: skip
    attempt_ids = []
    for study_task in sorted(study.tasks, key=lambda t: t.task_id):
        for _ in range(runs_per_task):
            attempt = studies.create_attempt(session, participant, study_task.task, actor_id)
            attempt_ids.append(attempt.id)
    audit.record(
        session, "participant.enrol_agent", "participant", participant.id, actor_id,
        runs_per_task=runs_per_task, attempts=attempt_ids, group=participant.group,
        settings_hash=settings_hash(participant),
    )  # fmt: skip
    return Enrolment(participant, attempt_ids)
