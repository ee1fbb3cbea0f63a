"""The study data model (SQLAlchemy 2.x typed ORM).

Every table of the platform lives here so that one Alembic history covers them all. Enumerations are
stored as short strings (``native_enum=False``) so SQLite and PostgreSQL share one migration.
Times are timezone-aware UTC.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship, synonym
from sqlalchemy.types import TypeDecorator

from baseline.db import Base


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware datetimes; SQLite drops the zone, so it is put back on the way out."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(
        cls,
        native_enum=False,
        length=32,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class Role(enum.StrEnum):
    ADMIN = "admin"
    COORDINATOR = "coordinator"
    GRADER = "grader"
    ANALYST = "analyst"
    PARTICIPANT = "participant"


class StudyStatus(enum.StrEnum):
    DRAFT = "draft"
    ACTIVE = "active"
    CLOSED = "closed"
    ARCHIVED = "archived"


class EgressPolicy(enum.StrEnum):
    NONE = "none"
    OPEN = "open"
    BLACKLIST = "blacklist"


class TaskKind(enum.StrEnum):
    PAPER = "paper"
    SCORED = "scored"
    EXPBENCH = "expbench"  # one EXP-Bench question on a masked repository (baseline.tasks.expbench)


class ParticipantKind(enum.StrEnum):
    HUMAN = "human"
    AGENT = "agent"


class AttemptStatus(enum.StrEnum):
    PENDING = "pending"  # waiting for a host with free GPUs
    READY = "ready"  # workspace up, clock not started (a human who has not logged in)
    RUNNING = "running"
    PAUSED = "paused"
    SUBMITTED = "submitted"
    ENDED = "ended"  # limit reached
    FAILED = "failed"  # workspace died and was not restarted
    DISQUALIFIED = "disqualified"


# An attempt that holds (or waits for) its workspace: its clock may run and its tokens work.
LIVE_ATTEMPT_STATUSES = frozenset(
    {AttemptStatus.READY, AttemptStatus.RUNNING, AttemptStatus.PAUSED}
)


class PauseReason(enum.StrEnum):
    PARTICIPANT = "participant"
    RATE_LIMIT = "rate_limit"
    SCORING = "scoring"
    ADMIN = "admin"
    OUTAGE = "outage"
    NOT_STARTED = "not_started"  # a human's clock before the first login
    GENERATION = "generation"  # an agent's model call, when a study does not count it as work
    IDLE = "idle"  # a human's workspace showed no activity for the study's idle minutes
    NO_DRIVER = "no_driver"  # an agent's run is unfinished and no worker drives it


class SnapshotKind(enum.StrEnum):
    START = "start"
    CHECKPOINT = "checkpoint"
    INTERVAL = "interval"
    MANUAL = "manual"
    FINAL = "final"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


class GradingKind(enum.StrEnum):
    JUDGE = "judge"
    SCRIPT = "script"
    EXPERT = "expert"


class WorkspacePurpose(enum.StrEnum):
    ATTEMPT = "attempt"
    REPRODUCTION = "reproduction"
    SCORING = "scoring"


class WorkspaceStatus(enum.StrEnum):
    PENDING = "pending"
    CREATING = "creating"
    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"
    DESTROYED = "destroyed"


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[Role] = mapped_column(_enum(Role))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")


class ApiToken(Base):
    """A per-user API token; only its sha256 is stored, the prefix lets a user tell them apart."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(back_populates="tokens")


class HubLoginToken(Base):
    """A one-time, short-lived token that logs a participant into JupyterHub for one attempt.

    The portal issues it on "Open workspace" and the hub's authenticator redeems it (once, before
    it expires) through the portal's hub-service route; only its sha256 is stored.
    """

    __tablename__ = "hub_login_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A staff member's audited "observe" login (`hub_sessions.issue_observe_token`): user_id is
    # the staff member, who gets access to that one attempt's server and nothing else.
    observer: Mapped[bool] = mapped_column(Boolean, default=False)
    # The portal session that issued it, and (once redeemed) the sha256 of the hub's session id
    # of the browser that spent it: the hub login in that browser lives as long as that portal
    # session, not as long as any session of the user (`hub_sessions.portal_session_live`).
    user_session_id: Mapped[int | None] = mapped_column(
        ForeignKey("user_sessions.id", ondelete="SET NULL")
    )
    hub_session_hash: Mapped[str | None] = mapped_column(String(64), index=True)


class Invitation(Base):
    """A single-use, expiring link through which a participant (or other role) joins."""

    __tablename__ = "invitations"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    email: Mapped[str | None] = mapped_column(String(320))
    role: Mapped[Role] = mapped_column(_enum(Role), default=Role.PARTICIPANT)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    used_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


class UserSession(Base):
    """One browser login. The cookie carries only a random id (its sha256 is stored here), so
    logging out, a password change or a deactivation ends every copy of the cookie."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LoginFailure(Base):
    """A refused login (or invitation probe), kept in the database so that the rate limit holds
    across every portal process. Keyed by the e-mail as typed (known or not) and by the client."""

    __tablename__ = "login_failures"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    client: Mapped[str] = mapped_column(String(64), index=True)


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[StudyStatus] = mapped_column(_enum(StudyStatus), default=StudyStatus.DRAFT)
    hardware_profile: Mapped[str] = mapped_column(String(64), default="cpu")
    # Working hours at which the submission is snapshotted (default PaperBench/RE-Bench points).
    checkpoint_hours: Mapped[list[float]] = mapped_column(JSON, default=lambda: [2, 8, 32, 48])
    snapshot_interval_minutes: Mapped[float | None] = mapped_column(Float)
    working_time_limit_hours: Mapped[float] = mapped_column(Float, default=48.0)
    wall_clock_limit_hours: Mapped[float | None] = mapped_column(Float)
    # Working seconds that pass per wall second; >1 compresses a study for dry runs and tests.
    time_scale: Mapped[float] = mapped_column(Float, default=1.0)
    egress_policy: Mapped[EgressPolicy] = mapped_column(
        _enum(EgressPolicy), default=EgressPolicy.BLACKLIST
    )
    reproduction_timeout_minutes: Mapped[float] = mapped_column(Float, default=720.0)
    # The judge new snapshots are graded with: {"judge": JudgeConfig, "code_dev": bool}; None
    # means snapshots are reproduced but not judged until one is set (`baseline rescore`).
    judge_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    human_hourly_rate_usd: Mapped[float] = mapped_column(Float, default=0.0)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # What snapshots keep: "baseline" drops caches and environments, "paperbench" keeps them as
    # PaperBench's own tarball does (infra.snapshots.limits_for_policy); exports state it.
    snapshot_policy: Mapped[str] = mapped_column(String(20), default="baseline")
    # When a workspace's host stops answering: "manual" (a coordinator moves the attempt) or
    # "automatic" (moved to another host of the same profile from its latest capture).
    outage_move: Mapped[str] = mapped_column(String(20), default="manual")
    # Idle auto-pause after this many working minutes (the attempt's time scale applies) without
    # activity in JupyterLab, busy kernel or running participant process; None: off.
    idle_pause_minutes: Mapped[float | None] = mapped_column(Float)
    # What a human participant accepts before the first login (None: the default text of
    # `baseline.workspaces.terminal_records`: terminal sessions and shell history are recorded).
    consent_text: Mapped[str | None] = mapped_column(Text)

    tasks: Mapped[list[StudyTask]] = relationship(
        back_populates="study", cascade="all, delete-orphan"
    )
    participants: Mapped[list[Participant]] = relationship(
        back_populates="study", cascade="all, delete-orphan"
    )


class Task(Base):
    """An imported task; its files live in the content-addressed store, listed in TaskFile."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(200), unique=True)
    title: Mapped[str] = mapped_column(String(500))
    kind: Mapped[TaskKind] = mapped_column(_enum(TaskKind))
    content_hash: Mapped[str] = mapped_column(String(64))
    # Summary numbers shown in lists (leaf counts, score range...), recomputed on import.
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Scored tasks: starting/reference score, direction, log transform, scoring command.
    scoring: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    files: Mapped[list[TaskFile]] = relationship(
        back_populates="task", cascade="all, delete-orphan"
    )


class FileVisibility(enum.StrEnum):
    PARTICIPANT = "participant"  # paper, addendum, instructions, starting files
    HIDDEN = "hidden"  # rubric, judge addendum: graders and the judge only
    PROTECTED = "protected"  # scoring-time only (RE-Bench protected files)


class TaskFile(Base):
    __tablename__ = "task_files"
    __table_args__ = (UniqueConstraint("task_id", "path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(String(1000))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    visibility: Mapped[FileVisibility] = mapped_column(_enum(FileVisibility))

    task: Mapped[Task] = relationship(back_populates="files")


class StudyTask(Base):
    __tablename__ = "study_tasks"
    __table_args__ = (UniqueConstraint("study_id", "task_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))

    study: Mapped[Study] = relationship(back_populates="tasks")
    task: Mapped[Task] = relationship()


class Participant(Base):
    """A human (linked to a user) or an agent configuration enrolled in one study."""

    __tablename__ = "participants"
    __table_args__ = (UniqueConstraint("study_id", "pseudonym"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    kind: Mapped[ParticipantKind] = mapped_column(_enum(ParticipantKind))
    display_name: Mapped[str] = mapped_column(String(200))
    # What graders see instead of the name and kind (blinding).
    pseudonym: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    agent_endpoint: Mapped[str | None] = mapped_column(String(500))
    agent_model: Mapped[str | None] = mapped_column(String(200))
    agent_scaffold: Mapped[str | None] = mapped_column(String(100))
    agent_limits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The analysis group its coordinator named (`studies.agent_enrolment`): one configuration's
    # settings per group unless pooled explicitly. None on rows from before: scaffold:model.
    agent_group: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # When the human accepted the study's consent text, and the sha256 of the text accepted.
    consent_accepted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    consent_sha256: Mapped[str | None] = mapped_column(String(64))

    study: Mapped[Study] = relationship(back_populates="participants")
    user: Mapped[User | None] = relationship()
    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="participant", cascade="all, delete-orphan"
    )

    @property
    def group(self) -> str:
        """The analysis group: 'human', or the agent configuration."""
        if self.kind is ParticipantKind.HUMAN:
            return "human"
        return self.agent_group or f"{self.agent_scaffold or 'agent'}:{self.agent_model or '?'}"


class Attempt(Base):
    """One participant on one task, with its own workspace, clock and snapshots."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="RESTRICT"))
    status: Mapped[AttemptStatus] = mapped_column(
        _enum(AttemptStatus), default=AttemptStatus.PENDING
    )
    hardware_profile: Mapped[str] = mapped_column(String(64))
    image_digest: Mapped[str | None] = mapped_column(String(200))
    working_time_limit_s: Mapped[float] = mapped_column(Float)
    wall_clock_limit_s: Mapped[float | None] = mapped_column(Float)
    time_scale: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(String(200))

    participant: Mapped[Participant] = relationship(back_populates="attempts")
    task: Mapped[Task] = relationship()
    study: Mapped[Study] = relationship()
    pauses: Mapped[list[Pause]] = relationship(
        back_populates="attempt", cascade="all, delete-orphan", order_by="Pause.started_at"
    )
    snapshots: Mapped[list[Snapshot]] = relationship(
        back_populates="attempt", cascade="all, delete-orphan", order_by="Snapshot.taken_at"
    )


class Pause(Base):
    __tablename__ = "pauses"
    __table_args__ = (Index("ix_pauses_attempt", "attempt_id", "started_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reason: Mapped[PauseReason] = mapped_column(_enum(PauseReason))
    note: Mapped[str] = mapped_column(Text, default="")

    attempt: Mapped[Attempt] = relationship(back_populates="pauses")


class Snapshot(Base):
    """An immutable capture of /home/submission; its manifest lives in the snapshot store."""

    __tablename__ = "snapshots"
    __table_args__ = (UniqueConstraint("attempt_id", "kind", "due_working_s"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    kind: Mapped[SnapshotKind] = mapped_column(_enum(SnapshotKind))
    due_working_s: Mapped[float] = mapped_column(Float)
    taken_working_s: Mapped[float] = mapped_column(Float)
    taken_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    late: Mapped[bool] = mapped_column(Boolean, default=False)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer, default=0)
    total_bytes: Mapped[int] = mapped_column(Integer, default=0)
    skipped_count: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(32), default="workspace")  # or "volume"

    attempt: Mapped[Attempt] = relationship(back_populates="snapshots")


class Reproduction(Base):
    __tablename__ = "reproductions"

    id: Mapped[int] = mapped_column(primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"))
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus), default=JobStatus.QUEUED)
    image_digest: Mapped[str | None] = mapped_column(String(200))
    hardware_profile: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    duration_s: Mapped[float | None] = mapped_column(Float)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    failure_class: Mapped[str | None] = mapped_column(String(64))
    log_sha256: Mapped[str | None] = mapped_column(String(64))
    executed_manifest_sha256: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    salvage_used: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    # Failed tries of the background run, and when the next may start (bounded back-off).
    tries: Mapped[int] = mapped_column(Integer, default=0)
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # While running: the runner's latest sign of life. A running row silent for long lost its
    # process (killed, its machine down) and is recovered (`reproductions.recover_interrupted`).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    snapshot: Mapped[Snapshot] = relationship()


class Grading(Base):
    """One grading of one snapshot: by the LLM judge, a scoring script, or an expert."""

    __tablename__ = "gradings"

    id: Mapped[int] = mapped_column(primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id", ondelete="CASCADE"))
    reproduction_id: Mapped[int | None] = mapped_column(
        ForeignKey("reproductions.id", ondelete="SET NULL")
    )
    kind: Mapped[GradingKind] = mapped_column(_enum(GradingKind))
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus), default=JobStatus.QUEUED)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    config_hash: Mapped[str] = mapped_column(String(64), default="")
    grader_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    score: Mapped[float | None] = mapped_column(Float)
    raw_score: Mapped[float | None] = mapped_column(Float)
    # Set when the score is the task's floor because the submission failed the scoring (a
    # participant's result, e.g. "no_score"); None for a measured score.
    floor_reason: Mapped[str | None] = mapped_column(String(40))
    leaves_total: Mapped[int] = mapped_column(Integer, default=0)
    leaves_graded: Mapped[int] = mapped_column(Integer, default=0)
    leaves_invalid: Mapped[int] = mapped_column(Integer, default=0)
    category_scores: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Failed tries of a background run, and when the next may start (bounded back-off).
    tries: Mapped[int] = mapped_column(Integer, default=0)
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # While running: the runner's claim (when it took the row) and its latest sign of life. A
    # running row silent for long lost its process and is recovered (`grading_recovery`).
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    snapshot: Mapped[Snapshot] = relationship()
    reproduction: Mapped[Reproduction | None] = relationship()
    leaves: Mapped[list[LeafGrade]] = relationship(
        back_populates="grading", cascade="all, delete-orphan"
    )


class LeafGrade(Base):
    __tablename__ = "leaf_grades"
    __table_args__ = (UniqueConstraint("grading_id", "leaf_path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    grading_id: Mapped[int] = mapped_column(ForeignKey("gradings.id", ondelete="CASCADE"))
    # Node ids are not unique in every rubric: leaves are addressed by their path ("0.3.1").
    leaf_path: Mapped[str] = mapped_column(String(200))
    leaf_id: Mapped[str] = mapped_column(String(200))
    score: Mapped[float | None] = mapped_column(Float)
    valid: Mapped[bool] = mapped_column(Boolean, default=False)
    explanation: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text)
    cache_key: Mapped[str | None] = mapped_column(String(64), index=True)
    # The judge's file ranking for this leaf is reused by this key (ranked paths in details).
    ranking_key: Mapped[str | None] = mapped_column(String(64), index=True)
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    grading: Mapped[Grading] = relationship(back_populates="leaves")


class ModelCall(Base):
    """The cost ledger: one row per model call (judge ranking and grading, agents)."""

    __tablename__ = "model_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    grading_id: Mapped[int | None] = mapped_column(ForeignKey("gradings.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(200))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ScoreLog(Base):
    """An intermediate score of a scored task, stamped with the working time it was asked at.

    Written when the score is asked, running while it is scored (the attempt's clock paused, a
    scoring workspace placed), so that one whose process died is recovered
    (`grading_recovery.recover_intermediate_scores`)."""

    __tablename__ = "score_logs"

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    working_s: Mapped[float] = mapped_column(Float)
    raw_score: Mapped[float | None] = mapped_column(Float)
    normalised_score: Mapped[float | None] = mapped_column(Float)
    floor_reason: Mapped[str | None] = mapped_column(String(40))  # as Grading.floor_reason
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Running while it is scored; then succeeded (a score, the floor included) or failed (none:
    # the scoring could not run, or its process died). None: written before it was recorded
    # (an older archive's rows), ended.
    status: Mapped[JobStatus | None] = mapped_column(_enum(JobStatus))
    # While running: the runner's latest sign of life (its claim is the row's creation,
    # `claims.Heartbeat`), and the scoring workspace it places, named before it stands; for a
    # family scored in its environment, which places none, its scoring run's name (its
    # container and state image, `family_environment.remove_scoring_run`).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    workspace: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime] = synonym("created_at")


class Host(Base):
    """A Docker host: local socket or a remote GPU machine reached over SSH."""

    __tablename__ = "hosts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    docker_url: Mapped[str] = mapped_column(String(500))  # unix:///... or ssh://user@host
    healthy: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    last_checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    # [{"index": 0, "uuid": "GPU-...", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}]
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    gpus_declared: Mapped[bool] = mapped_column(Boolean, default=False)


class Workspace(Base):
    __tablename__ = "workspaces"

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="SET NULL"))
    purpose: Mapped[WorkspacePurpose] = mapped_column(_enum(WorkspacePurpose))
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id", ondelete="SET NULL"))
    backend: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # A Docker container's id, or the local sandbox's workspace directory (a path under
    # BASELINE_HOME, as long as the home's own path makes it: 100 characters were too few).
    container_id: Mapped[str | None] = mapped_column(String(4096))
    image: Mapped[str] = mapped_column(String(300))
    image_digest: Mapped[str | None] = mapped_column(String(200))
    hardware_profile: Mapped[str] = mapped_column(String(64))
    submission_volume: Mapped[str | None] = mapped_column(String(300))
    # What a restart or a delayed placement needs to rebuild the identical workspace.
    network: Mapped[str] = mapped_column(String(200), default="none")
    task_dir: Mapped[str | None] = mapped_column(String(1000))
    # The container's environment (the egress proxy URL, with the workspace's proxy token).
    env: Mapped[dict[str, str] | None] = mapped_column(JSON)
    status: Mapped[WorkspaceStatus] = mapped_column(
        _enum(WorkspaceStatus), default=WorkspaceStatus.PENDING
    )
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    destroyed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class GpuAssignment(Base):
    """Exclusive use of one GPU by one live workspace; the partial index forbids a second."""

    __tablename__ = "gpu_assignments"
    __table_args__ = (
        Index(
            "uq_gpu_live",
            "host_id",
            "device_index",
            unique=True,
            sqlite_where=text("released_at IS NULL"),
            postgresql_where=text("released_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    device_index: Mapped[int] = mapped_column(Integer)
    gpu_uuid: Mapped[str | None] = mapped_column(String(100))
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"))
    assigned_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class EgressEvent(Base):
    """One outbound request from a workspace, allowed or refused by the egress proxy."""

    __tablename__ = "egress_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    workspace_id: Mapped[int | None] = mapped_column(
        ForeignKey("workspaces.id", ondelete="SET NULL")
    )
    workspace_name: Mapped[str] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    method: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    allowed: Mapped[bool] = mapped_column(Boolean)
    rule: Mapped[str | None] = mapped_column(Text)


class AuditEvent(Base):
    """Who did what, when, to what. Written by the domain layer on every state change."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    action: Mapped[str] = mapped_column(String(100))
    target_type: Mapped[str] = mapped_column(String(50))
    target_id: Mapped[str | None] = mapped_column(String(100))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class AgentRunStatus(enum.StrEnum):
    RUNNING = "running"  # also a run whose worker died: the next worker resumes it
    FINISHED = "finished"
    FAILED = "failed"


class AgentRun(Base):
    """One built-in agent driving one attempt; its settings are recorded with the results."""

    __tablename__ = "agent_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(
        ForeignKey("attempts.id", ondelete="CASCADE"), unique=True
    )
    scaffold: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(200))
    # `agents.settings.AgentSettings` as JSON (endpoint, prices, limits, generation_counts...).
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[AgentRunStatus] = mapped_column(
        _enum(AgentRunStatus), default=AgentRunStatus.RUNNING
    )
    steps: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    resumes: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(Text)

    entries: Mapped[list[TranscriptEntry]] = relationship(
        back_populates="run", cascade="all, delete-orphan", order_by="TranscriptEntry.seq"
    )


class AgentDriverLease(Base):
    """Who drives an attempt's agent now (a worker thread, an `agent run`): exactly one driver
    per attempt. The holder renews `expires_at` while it drives; a holder that died stops
    renewing, and once the lease has expired another driver may take it (`runs.driver_lease`)."""

    __tablename__ = "agent_driver_leases"

    attempt_id: Mapped[int] = mapped_column(
        ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True
    )
    holder: Mapped[str] = mapped_column(String(300))
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    renewed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)  # last sign of life
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TranscriptEntry(Base):
    """One step of an agent's transcript: a message, a tool call's start, a failed model call,
    or a notice. Messages are the conversation (``in_context`` False once truncated away)."""

    __tablename__ = "transcript_entries"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("agent_runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))  # message, tool_start, model_error, notice
    role: Mapped[str | None] = mapped_column(String(16))
    content: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    tool_call_id: Mapped[str | None] = mapped_column(String(200))
    tool_name: Mapped[str | None] = mapped_column(String(64))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    # The whole kept output of a tool call when it was larger than what the agent was shown.
    output_sha256: Mapped[str | None] = mapped_column(String(64))
    output_bytes: Mapped[int] = mapped_column(Integer, default=0)
    in_context: Mapped[bool] = mapped_column(Boolean, default=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    working_s: Mapped[float] = mapped_column(Float, default=0.0)

    run: Mapped[AgentRun] = relationship(back_populates="entries")


class BlacklistHit(Base):
    """A use of a blacklisted resource found by the monitor, with its evidence, for review."""

    __tablename__ = "blacklist_hits"
    __table_args__ = (UniqueConstraint("attempt_id", "evidence_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(String(32))  # egress, transcript, shell_history
    rule: Mapped[str] = mapped_column(Text)  # the blacklist entry matched
    evidence: Mapped[str] = mapped_column(Text)  # the URL or the line, as found
    location: Mapped[str] = mapped_column(String(300))  # where: event id, step, file and line
    at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # when it happened, if known
    # sha256 of (source, location, evidence): scanning again finds the same hit, not a new one.
    evidence_key: Mapped[str] = mapped_column(String(64))
    found_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ModelKey(Base):
    """A per-attempt key for the model passthrough (`baseline.runs.model_passthrough`): what a
    command agent in the workspace holds instead of the provider's key. It authorizes model calls
    for its one attempt and nothing else (not the portal, not the API); only its sha256 is
    stored."""

    __tablename__ = "model_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AttemptToken(Base):
    """A per-attempt secret (hash only): what an API agent and the workspace's `task` command
    authenticate with. It opens that one attempt's workspace routes and nothing else, and stops
    working when the attempt ends (``baseline.workspaces.attempt_tokens``)."""

    __tablename__ = "attempt_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # agent (handed to an API agent), workspace
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TerminalRecording(Base):
    """One recorded terminal session (`script` typescript) or shell history file of a human
    attempt's workspace, as last collected (``baseline.workspaces.terminal_records``): coordinators
    only."""

    __tablename__ = "terminal_recordings"
    __table_args__ = (UniqueConstraint("attempt_id", "path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(String(500))
    kind: Mapped[str] = mapped_column(String(16))  # session, history, gaps (`terminal_recorder`)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    collected_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AlertRule(enum.StrEnum):
    """The study monitor's alert rules (``baseline.monitor.rules``), each with its own threshold."""

    WORKSPACE_DEAD = "workspace_dead"  # a live attempt's workspace died and was not restarted
    IDLE = "idle"  # a participant idle past N working minutes while the clock runs
    SNAPSHOT_LATE = "snapshot_late"  # a checkpoint snapshot missing N working minutes past due
    FAILURE_RATE = "failure_rate"  # reproductions or gradings failing above a share
    QUEUE_AGE = "queue_age"  # the oldest queued reproduction or grading older than N minutes
    HOST_DOWN = "host_down"  # an enabled host failing its health check
    SPEND = "spend"  # judge and agent spend past a share of the study's budget


class MonitorSettings(Base):
    """A study's monitor settings: budget, alert thresholds, and where alerts are delivered."""

    __tablename__ = "monitor_settings"

    study_id: Mapped[int] = mapped_column(
        ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True
    )
    budget_usd: Mapped[float | None] = mapped_column(Float)
    # {rule: threshold}; a rule absent takes its default, a rule set to None is off.
    thresholds: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    email_to: Mapped[list[str]] = mapped_column(JSON, default=list)
    webhook_url: Mapped[str | None] = mapped_column(String(500))
    # The HMAC-SHA256 key the webhook's signature header is made with (shown once, on creation).
    webhook_secret: Mapped[str | None] = mapped_column(String(200))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


class Alert(Base):
    """One firing of one rule for one subject (an attempt, a host, the study's queue or spend):
    open while ``cleared_at`` is None; at most one open alert per study, rule and subject."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_open", "study_id", "rule", "subject", "cleared_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    rule: Mapped[AlertRule] = mapped_column(_enum(AlertRule))
    subject: Mapped[str] = mapped_column(String(100))  # "attempt:12", "host:3", "study"
    message: Mapped[str] = mapped_column(Text)
    fired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    cleared_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    acknowledged_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )


class AlertDelivery(Base):
    """One delivery of an alert's firing or clearing, by e-mail or webhook, with its outcome."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    channel: Mapped[str] = mapped_column(String(16))  # email, webhook
    event: Mapped[str] = mapped_column(String(16))  # fired, cleared
    target: Mapped[str] = mapped_column(String(500))
    tries: Mapped[int] = mapped_column(Integer, default=0)
    ok: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
