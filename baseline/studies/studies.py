"""Studies, their tasks and participants, and attempts: the coordinator's operations."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import Conflict, DomainError, InvalidInput, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    EgressPolicy,
    Participant,
    ParticipantKind,
    Role,
    Study,
    StudyStatus,
    StudyTask,
    Task,
    User,
)
from infra.hardware import ProfileConfigError, load_profiles
from infra.snapshots import ExportPolicy
from scoring.task_standard import study_refusals

DEFAULT_CHECKPOINTS: tuple[float, ...] = (2.0, 8.0, 32.0, 48.0)
HARDWARE_PROFILE_NAME_MAX = 64
SNAPSHOT_POLICIES = get_args(ExportPolicy)


@dataclass
class StudySpec:
    """What a coordinator chooses when creating a study; validated before anything is stored."""

    name: str
    description: str = ""
    hardware_profile: str = "cpu"
    checkpoint_hours: Sequence[float] = DEFAULT_CHECKPOINTS
    snapshot_interval_minutes: float | None = None
    working_time_limit_hours: float = 48.0
    wall_clock_limit_hours: float | None = None
    time_scale: float = 1.0
    egress_policy: str = EgressPolicy.BLACKLIST.value
    reproduction_timeout_minutes: float = 720.0
    human_hourly_rate_usd: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    snapshot_policy: str = "baseline"
    idle_pause_minutes: float | None = None  # None: no idle auto-pause (baseline.hub.hub_watch)
    consent_text: str | None = (
        None  # None: baseline.workspaces.terminal_records.DEFAULT_CONSENT_TEXT
    )

    def validate(self) -> None:
        if not self.name.strip():
            raise InvalidInput("name: must not be empty")
        if len(self.name) > 200:
            raise InvalidInput("name: at most 200 characters")
        if not self.hardware_profile or len(self.hardware_profile) > HARDWARE_PROFILE_NAME_MAX:
            raise InvalidInput("hardware_profile: must be a profile name of 1-64 characters")
        _positive("working_time_limit_hours", self.working_time_limit_hours)
        _positive("time_scale", self.time_scale)
        _positive("reproduction_timeout_minutes", self.reproduction_timeout_minutes)
        if self.wall_clock_limit_hours is not None:
            _positive("wall_clock_limit_hours", self.wall_clock_limit_hours)
        if self.snapshot_interval_minutes is not None:
            _positive("snapshot_interval_minutes", self.snapshot_interval_minutes)
        if self.idle_pause_minutes is not None:
            _positive("idle_pause_minutes", self.idle_pause_minutes)
        if not math.isfinite(self.human_hourly_rate_usd) or self.human_hourly_rate_usd < 0:
            raise InvalidInput("human_hourly_rate_usd: must be a number >= 0")
        for index, hours in enumerate(self.checkpoint_hours):
            _positive(f"checkpoint_hours[{index}]", hours)
        if list(self.checkpoint_hours) != sorted(set(self.checkpoint_hours)):
            raise InvalidInput("checkpoint_hours: must be strictly increasing")
        if self.snapshot_policy not in SNAPSHOT_POLICIES:
            raise InvalidInput(f"snapshot_policy: expected one of {', '.join(SNAPSHOT_POLICIES)}")
        try:
            EgressPolicy(self.egress_policy)
        except ValueError as exc:
            options = ", ".join(p.value for p in EgressPolicy)
            raise InvalidInput(f"egress_policy: expected one of {options}") from exc


def _positive(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{name}: must be a number > 0, got {value!r}")


def create_study(session: Session, spec: StudySpec, actor_id: int | None) -> Study:
    spec.validate()
    if session.scalar(select(Study).where(Study.name == spec.name.strip())) is not None:
        raise Conflict(f"a study named {spec.name.strip()!r} exists already")
    study = Study(
        name=spec.name.strip(),
        description=spec.description,
        hardware_profile=spec.hardware_profile,
        checkpoint_hours=[float(h) for h in spec.checkpoint_hours],
        snapshot_interval_minutes=spec.snapshot_interval_minutes,
        working_time_limit_hours=spec.working_time_limit_hours,
        wall_clock_limit_hours=spec.wall_clock_limit_hours,
        time_scale=spec.time_scale,
        egress_policy=EgressPolicy(spec.egress_policy),
        reproduction_timeout_minutes=spec.reproduction_timeout_minutes,
        human_hourly_rate_usd=spec.human_hourly_rate_usd,
        created_by_id=actor_id,
        snapshot_policy=spec.snapshot_policy,
        idle_pause_minutes=spec.idle_pause_minutes,
        consent_text=(spec.consent_text or "").strip() or None,
    )
    session.add(study)
    session.flush()
    audit.record(session, "study.create", "study", study.id, actor_id, name=study.name)
    return study


def get_study(session: Session, study_id: int) -> Study:
    study = session.get(Study, study_id)
    if study is None:
        raise NotFound(f"no study with id {study_id}")
    return study


def find_study(session: Session, name_or_id: str) -> Study:
    study = (
        session.get(Study, int(name_or_id))
        if name_or_id.isdigit()
        else session.scalar(select(Study).where(Study.name == name_or_id))
    )
    if study is None:
        raise NotFound(f"no study named or numbered {name_or_id!r}")
    return study


def list_studies(session: Session) -> list[Study]:
    return list(session.scalars(select(Study).order_by(Study.id)))


# What a study's status means: a draft is being set up (it becomes active when its first attempt
# starts, `activate_on_first_start`); a closed or archived one takes no new attempts or
# participants, its results kept as they are.
STATUS_MEANING = {
    StudyStatus.DRAFT: "being set up, no attempt has started yet",
    StudyStatus.ACTIVE: "running, attempts are created and launched",
    StudyStatus.CLOSED: "finished, no new attempts or participants, results kept",
    StudyStatus.ARCHIVED: "kept for the record, nothing more is run, added or scored",
}


def live_attempts(session: Session, study_id: int) -> list[str]:
    """The study's attempts whose clock may still run (ready, running, paused), as "attempt ID
    (status)". An archived study, and an archive of one, is the record of attempts that ended or
    never started: these must end first (a home importing them would have clocks running with no
    workspace behind them). A pending attempt never started; an archived study launches none
    (`launch.NOT_LAUNCHING`)."""
    rows = session.execute(
        select(Attempt.id, Attempt.status)
        .where(Attempt.study_id == study_id, Attempt.status.in_(LIVE_ATTEMPT_STATUSES))
        .order_by(Attempt.id)
    )
    return [f"attempt {attempt_id} ({status.value})" for attempt_id, status in rows]


def set_status(session: Session, study: Study, status: StudyStatus, actor_id: int | None) -> None:
    """Change the status; back to draft only while no attempt has started (a draft is a study
    whose attempts are not running yet); archived only once no attempt's clock can run (nothing
    more is scored for an archived study, so one under way would run on unscored)."""
    previous = study.status
    live = live_attempts(session, study.id) if status is StudyStatus.ARCHIVED else []
    if live and previous is not StudyStatus.ARCHIVED:
        raise Conflict(
            f"status archived: {', '.join(live)} still under way, and nothing more is run or "
            "scored for an archived study; end them or wait for them first (closing the study "
            "stops new attempts and lets these finish)"
        )
    started = first_started_attempt(session, study) if status is StudyStatus.DRAFT else None
    if started is not None and previous is not StudyStatus.DRAFT:
        raise Conflict(
            f"status draft: attempt {started.id} has started already, so the study is no longer "
            "being set up (close it to stop new attempts)"
        )
    study.status = status
    audit.record(session, "study.status", "study", study.id, actor_id, was=previous, now=status)


# What may change after the first attempt started: labels and the payout rate, none of which
# enters an attempt's clock, snapshots or grading. Everything else of a StudySpec defines what
# the attempts of a study are measured under, so it is fixed once one of them has started.
EDITABLE_ANY_TIME = frozenset({"name", "description", "human_hourly_rate_usd"})
FIXED_ONCE_STARTED = frozenset(
    {
        "hardware_profile",
        "checkpoint_hours",
        "snapshot_interval_minutes",
        "working_time_limit_hours",
        "wall_clock_limit_hours",
        "time_scale",
        "egress_policy",
        "snapshot_policy",
        "idle_pause_minutes",
        "reproduction_timeout_minutes",
    }
)
EDITABLE = EDITABLE_ANY_TIME | FIXED_ONCE_STARTED


def spec_of(study: Study) -> StudySpec:
    """The study's current settings as a spec, the starting point of an edit."""
    return StudySpec(
        name=study.name,
        description=study.description,
        hardware_profile=study.hardware_profile,
        checkpoint_hours=[float(h) for h in study.checkpoint_hours],
        snapshot_interval_minutes=study.snapshot_interval_minutes,
        working_time_limit_hours=study.working_time_limit_hours,
        wall_clock_limit_hours=study.wall_clock_limit_hours,
        time_scale=study.time_scale,
        egress_policy=study.egress_policy.value,
        reproduction_timeout_minutes=study.reproduction_timeout_minutes,
        human_hourly_rate_usd=study.human_hourly_rate_usd,
        snapshot_policy=study.snapshot_policy,
        idle_pause_minutes=study.idle_pause_minutes,
        consent_text=study.consent_text,
    )


def first_started_attempt(session: Session, study: Study) -> Attempt | None:
    """The study's earliest started attempt: from then on its comparability settings are fixed."""
    return session.scalar(
        select(Attempt)
        .where(Attempt.study_id == study.id, Attempt.started_at.is_not(None))
        .order_by(Attempt.started_at, Attempt.id)
        .limit(1)
    )


def edit_study(
    session: Session, study: Study, changes: dict[str, Any], actor_id: int | None
) -> dict[str, dict[str, Any]]:
    """Change a study's settings, audited with each changed value before and after.

    Settings that define comparability are refused once an attempt has started (every attempt
    of a study must be measured alike); before that, the attempts already created (pending)
    take the new limits, as they copy them from the study. Returns the changes made."""
    unknown = sorted(set(changes) - EDITABLE)
    if unknown:
        raise InvalidInput(f"not an editable study setting: {', '.join(unknown)}")
    spec = spec_of(study)
    for name, value in changes.items():
        setattr(spec, name, value.strip() if name == "name" else value)
    spec.validate()
    after = _values(spec)
    before = _values(spec_of(study))
    changed = {
        k: {"before": before[k], "after": after[k]} for k in changes if before[k] != after[k]
    }
    fixed = sorted(set(changed) & FIXED_ONCE_STARTED)
    started = first_started_attempt(session, study) if fixed else None
    if started is not None:
        raise Conflict(
            f"{', '.join(fixed)}: fixed since attempt {started.id} started (every attempt of a "
            "study is measured under the same settings); create a new study to change "
            + ("them" if len(fixed) > 1 else "it")
        )
    if "name" in changed:
        clash = session.scalar(select(Study).where(Study.name == spec.name, Study.id != study.id))
        if clash is not None:
            raise Conflict(f"a study named {spec.name!r} exists already")
    if not changed:
        return {}
    _apply(study, {k: v["after"] for k, v in changed.items()})
    if {"hardware_profile", "egress_policy"} & set(changed):
        try:
            for task in study_tasks(session, study):
                check_runnable(study, task)
        except DomainError:
            _apply(study, {k: v["before"] for k, v in changed.items()})
            raise
    _copy_limits_to_pending(session, study)
    audit.record(session, "study.edit", "study", study.id, actor_id, changes=changed)
    return changed


def _apply(study: Study, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(study, name, EgressPolicy(value) if name == "egress_policy" else value)


def _values(spec: StudySpec) -> dict[str, Any]:
    """The editable settings of a spec as stored (JSON-ready), for comparing and auditing."""
    values: dict[str, Any] = {name: getattr(spec, name) for name in EDITABLE}
    values["checkpoint_hours"] = [float(h) for h in spec.checkpoint_hours]
    return values


def _copy_limits_to_pending(session: Session, study: Study) -> None:
    """Attempts copy the study's limits when created; those not started yet follow an edit."""
    for attempt in session.scalars(
        select(Attempt).where(Attempt.study_id == study.id, Attempt.started_at.is_(None))
    ):
        attempt.hardware_profile = study.hardware_profile
        attempt.working_time_limit_s = study.working_time_limit_hours * 3600.0
        attempt.wall_clock_limit_s = (
            None if study.wall_clock_limit_hours is None else study.wall_clock_limit_hours * 3600.0
        )
        attempt.time_scale = study.time_scale


def add_task(session: Session, study: Study, task: Task, actor_id: int | None) -> None:
    exists = session.scalar(
        select(StudyTask).where(StudyTask.study_id == study.id, StudyTask.task_id == task.id)
    )
    if exists is not None:
        raise Conflict(f"task {task.slug} is already part of study {study.name}")
    check_open(study, "tasks")
    if _private_elsewhere(session, study, task):
        raise Conflict(f"task {task.slug} is private to another study")
    check_runnable(study, task)
    session.add(StudyTask(study=study, task=task))
    audit.record(session, "study.add_task", "study", study.id, actor_id, task=task.slug)


def check_runnable(study: Study, task: Task) -> None:
    """Refuse a Task Standard family task the study cannot run (its hardware profile lacks the
    task's GPUs or resources, its egress policy disagrees with full_internet), saying why, when
    the task is added and when an attempt of it is created, not only once it is launched."""
    standard = (task.scoring or {}).get("task_standard")
    if not isinstance(standard, dict):
        return
    try:
        profiles = load_profiles()
    except ProfileConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    refusals = study_refusals(standard, study.hardware_profile, profiles, study.egress_policy.value)
    if refusals:
        raise InvalidInput(
            f"task {task.slug} cannot run in study {study.name!r}: it {'; it '.join(refusals)}"
        )


def _private_elsewhere(session: Session, study: Study, task: Task) -> bool:
    """A synthetic task (seeded for one study, with no real files) belongs to that study only."""
    if not (task.summary or {}).get("synthetic"):
        return False
    owners = set(session.scalars(select(StudyTask.study_id).where(StudyTask.task_id == task.id)))
    return bool(owners - {study.id})


def addable_tasks(session: Session, study: Study) -> list[Task]:
    """Tasks the study may add: not in it yet, and not private to another study."""
    present = {st.task_id for st in study.tasks}
    return [
        task
        for task in session.scalars(select(Task).order_by(Task.slug))
        if task.id not in present and not _private_elsewhere(session, study, task)
    ]


def study_tasks(session: Session, study: Study) -> list[Task]:
    return list(
        session.scalars(
            select(Task).join(StudyTask).where(StudyTask.study_id == study.id).order_by(Task.slug)
        )
    )


def new_pseudonym(session: Session, study_id: int) -> str:
    """A random, study-unique label that tells graders nothing about who or what it is."""
    while True:
        candidate = "P-" + secrets.token_hex(3).upper()
        taken = session.scalar(
            select(func.count())
            .select_from(Participant)
            .where(Participant.study_id == study_id, Participant.pseudonym == candidate)
        )
        if not taken:
            return candidate


def enroll_human(session: Session, study_id: int, user: User, actor_id: int | None) -> Participant:
    if user.role is not Role.PARTICIPANT:
        raise InvalidInput(f"{user.email} is a {user.role.value}, not a participant")
    check_open(get_study(session, study_id))
    existing = session.scalar(
        select(Participant).where(Participant.study_id == study_id, Participant.user_id == user.id)
    )
    if existing is not None:
        raise Conflict(f"{user.email} is already enrolled in study {study_id}")
    participant = Participant(
        study_id=study_id,
        kind=ParticipantKind.HUMAN,
        display_name=user.name,
        pseudonym=new_pseudonym(session, study_id),
        user_id=user.id,
    )
    session.add(participant)
    session.flush()
    audit.record(session, "participant.enroll", "participant", participant.id, actor_id)
    return participant


def add_agent(
    session: Session,
    study: Study,
    name: str,
    scaffold: str,
    model: str,
    endpoint: str,
    limits: dict[str, Any] | None,
    actor_id: int | None,
) -> Participant:
    if not name.strip() or not scaffold.strip() or not model.strip():
        raise InvalidInput("an agent needs a name, a scaffold and a model")
    check_open(study)
    participant = Participant(
        study_id=study.id,
        kind=ParticipantKind.AGENT,
        display_name=name.strip(),
        pseudonym=new_pseudonym(session, study.id),
        agent_scaffold=scaffold.strip(),
        agent_model=model.strip(),
        agent_endpoint=endpoint.strip(),
        agent_limits=limits or {},
    )
    session.add(participant)
    session.flush()
    audit.record(session, "participant.add_agent", "participant", participant.id, actor_id)
    return participant


def activate_on_first_start(session: Session, study: Study, actor_id: int | None) -> None:
    """A draft study whose first attempt starts is running: it becomes active (audited), so its
    status says what is happening."""
    if study.status is StudyStatus.DRAFT:
        study.status = StudyStatus.ACTIVE
        audit.record(session, "study.status", "study", study.id, actor_id, was=StudyStatus.DRAFT,
                     now=StudyStatus.ACTIVE, why="its first attempt started")  # fmt: skip


def is_open(study: Study) -> bool:
    """Whether the study takes new attempts and participants: a closed or archived one not."""
    return study.status not in (StudyStatus.CLOSED, StudyStatus.ARCHIVED)


def check_open(study: Study, adding: str = "attempts or participants") -> None:
    """A closed or archived study takes no new attempts, participants or tasks: its results
    are what they are. `adding` names what was asked for, for the refusal's message."""
    if not is_open(study):
        raise Conflict(
            f"study {study.name!r} is {study.status.value}: it takes no new {adding} "
            "(make it active again to add them)"
        )


def check_not_archived(study: Study, asked: str) -> None:
    """An archived study is a record: nothing more is run or scored for it, so its numbers stay
    those its archive and its reports gave. `asked` names what was asked for, as "set it closed
    to ..." says it."""
    if study.status is StudyStatus.ARCHIVED:
        raise Conflict(
            f"study {study.name!r} is archived: kept for the record, nothing more is run or "
            f"scored for it (set it closed to {asked})"
        )


def create_attempt(
    session: Session, participant: Participant, task: Task, actor_id: int | None
) -> Attempt:
    study = participant.study
    check_open(study)
    if task.id not in {st.task_id for st in study.tasks}:
        raise InvalidInput(f"task {task.slug} is not part of study {study.name}")
    check_runnable(study, task)
    attempt = Attempt(
        study_id=study.id,
        participant=participant,
        task=task,
        status=AttemptStatus.PENDING,
        hardware_profile=study.hardware_profile,
        working_time_limit_s=study.working_time_limit_hours * 3600.0,
        wall_clock_limit_s=(
            None if study.wall_clock_limit_hours is None else study.wall_clock_limit_hours * 3600.0
        ),
        time_scale=study.time_scale,
    )
    session.add(attempt)
    session.flush()
    audit.record(session, "attempt.create", "attempt", attempt.id, actor_id, task=task.slug)
    return attempt
