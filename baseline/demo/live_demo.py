"""The live demo study: built-in agents on the demo tasks, time-scaled, driven by the replay model.

Why: a person trying Baseline should see the whole loop move within minutes and with no API key:
an agent's tool calls running in a real workspace, checkpoints taken on schedule, reproduced,
judged (the scored task: its real scoring script) and the analysis table growing. The agents and
the judge talk to `baseline.demo.replay_model` (recorded answers, labelled as such); everything else
is the platform's ordinary path: `launch`, `agent_worker.Worker`, `schedule` and `orchestration`.

One working hour is `HOUR_WALL_S` wall seconds (study ``time_scale``). `LiveDemo.tick` does one
round of the work a deployment's background processes do (start agent runs, run the scoring
queue); `LiveDemo.run_forever` repeats it every `TICK_S` seconds, in a thread of `baseline demo`.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.errors import DockerException
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import launch
from baseline.attempts.snapshots import (
    DirectorySource,
    SourceFinder,
    SubmissionSource,
    register_source_finder,
)
from baseline.context import Context
from baseline.demo.demo import DEMO_USERS
from baseline.demo.replay_model import JUDGE_PREFIX, agent_models
from baseline.jobs import orchestration
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    Grading,
    GradingKind,
    Host,
    JobStatus,
    Participant,
    Role,
    Snapshot,
    Study,
    Task,
    User,
    Workspace,
    WorkspacePurpose,
)
from baseline.runs import agent_worker
from baseline.studies import agent_enrolment, studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.local_backend import CONTROLLERS, HOST_IMAGE, LocalSandboxBackend
from scoring.llm import JudgeConfig, ModelPrice

log = logging.getLogger(__name__)

LIVE_STUDY = "Live demo study (replay model, time-scaled)"
HOUR_WALL_S = 4.0
TIME_SCALE = 3600.0 / HOUR_WALL_S
CHECKPOINT_HOURS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)
LIMIT_HOURS = 8.0
# The demo participant's own attempt: long enough (8 wall minutes) to look around JupyterLab.
PARTICIPANT_LIMIT_HOURS = 120.0
PARTICIPANT_TASK = "digits-baselines"
TICK_S = 1.0
HOST_NAME = "local"
SANDBOX_HOST = "local-sandbox"
DOCKER = "docker"
SANDBOX = "sandbox"
SANDBOX_CGROUP_PARENT = "baseline-demo"
ZERO_PRICE = {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}
# The replay has one recorded agent per task, each its own model name; they are one agent (the
# basic scaffold replaying recorded runs), so they are one analysis group, pooled explicitly
# (audited), and the demo participant's task is a task that group and the humans share: the
# curves compare like with like once the participant has worked, instead of two agent groups of
# one task each beside the humans, sharing no task.
AGENT_GROUP = "basic agent (replay)"


def scale_words() -> str:
    """The time scale in plain words, as the pages and the CLI say it."""
    return (
        f"Time-scaled: one working hour of the study passes in {HOUR_WALL_S:g} wall seconds, "
        f"so the {LIMIT_HOURS:g}-hour attempts end within a minute."
    )


def clock_words() -> str:
    """The banner every portal page shows while the live demo runs (plain words, no jargon)."""
    return f"Demo time: 1 working hour passes every {HOUR_WALL_S:g} seconds."


@dataclass(frozen=True)
class DemoNotice:
    """What the portal says on every page while the live demo runs: the clock's speed, where
    workspaces run and what a real study needs instead, and (participants) whether JupyterLab
    can open."""

    clock: str
    backend: str
    real_study: str
    workspace: str | None


def demo_notice(backend: str, jupyterlab: bool, chosen: bool = False) -> DemoNotice:
    """The banner's words; `chosen`: the backend was asked for (``--workspaces``), not the
    fallback of a machine without Docker."""
    workspace = None
    if not jupyterlab:
        workspace = (
            "Opening a workspace in JupyterLab needs the Docker backend (and JupyterHub's proxy); "
            "this demo runs without it, so the demo participant has no workspace to open here."
            if backend == SANDBOX
            else "JupyterLab is not running in this demo (configurable-http-proxy is not "
            "installed), so the demo participant has no workspace to open here."
        )
    return DemoNotice(
        clock=clock_words(),
        backend=backend_words(backend, chosen),
        real_study=(
            "The agents and the judge answer from recordings (no API key); a real study "
            "connects a real model API."
        ),
        workspace=workspace,
    )


def docker_available(url: str = launch.LOCAL_ENGINE) -> bool:
    """Whether the local Docker Engine answers (the demo's workspaces then run in it)."""
    try:
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=5)
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except DockerException:
        return False
    finally:
        client.close()


def backend_words(backend: str, chosen: bool = False) -> str:
    """Where workspaces run, and why: the sandbox is either asked for or the fallback."""
    if backend == DOCKER:
        return "Workspaces run in the local Docker Engine (as in a real study, one host)."
    why = "as chosen (--workspaces sandbox)" if chosen else "because no Docker Engine was found"
    return (
        f"Workspaces run in the local sandbox backend (bubblewrap), {why}: fine for a demo, but a "
        "real study needs Docker hosts (`baseline host add`)."
    )


def sandbox_backend(home: Path, cgroup_parent: str = SANDBOX_CGROUP_PARENT) -> LocalSandboxBackend:
    """The local sandbox backend of a demo without Docker: workspaces under `home`, the host's
    userland plus this Python environment (read-only: the demo tasks need numpy and
    scikit-learn, which Baseline's own environment has)."""
    for controller in CONTROLLERS:
        (Path("/sys/fs/cgroup") / controller / cgroup_parent).mkdir(exist_ok=True)
    environments = dict.fromkeys(Path(p).resolve() for p in (sys.prefix, sys.base_prefix))
    return LocalSandboxBackend(
        home / "sandbox",
        cgroup_parent=cgroup_parent,
        ro_binds=tuple(environments),
        path_prefix=(str(Path(sys.prefix) / "bin"),),
    )


def sandbox_source(backend: LocalSandboxBackend) -> SourceFinder:
    """How snapshots read an attempt's submission on the sandbox host: its directory."""

    def find(session: Session, attempt: Attempt) -> SubmissionSource | None:
        workspace = session.scalar(
            select(Workspace)
            .join(Host, Workspace.host_id == Host.id)
            .where(
                Workspace.attempt_id == attempt.id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Host.name == SANDBOX_HOST,
            )
            .order_by(Workspace.id.desc())
            .limit(1)
        )
        if workspace is None or workspace.submission_volume is None:
            return None
        return DirectorySource(str(backend.submission_dir(workspace.submission_volume)))

    return find


def judge_config(base_url: str, task: str) -> JudgeConfig:
    return JudgeConfig(
        base_url=base_url,
        model=JUDGE_PREFIX + task,
        price=ModelPrice(**ZERO_PRICE),
        concurrency=8,
        timeout_s=30.0,
        backoff_initial_s=0.2,
        backoff_max_s=2.0,
    )


def progress_lines(session: Session, study_id: int, after: int) -> tuple[list[str], int]:
    """One line per judged or script-scored snapshot of the study with a grading id above
    `after`, oldest first, and the last id told."""
    rows = session.execute(
        select(Grading.id, Grading.score, Grading.kind, Snapshot, Attempt.id, Participant)
        .add_columns(Task.slug)
        .join(Snapshot, Grading.snapshot_id == Snapshot.id)
        .join(Attempt, Snapshot.attempt_id == Attempt.id)
        .join(Participant, Attempt.participant_id == Participant.id)
        .join(Task, Attempt.task_id == Task.id)
        .where(
            Attempt.study_id == study_id,
            Grading.id > after,
            Grading.kind.in_([GradingKind.JUDGE, GradingKind.SCRIPT]),
            Grading.status == JobStatus.SUCCEEDED,
        )
        .order_by(Grading.id)
    ).all()
    lines = []
    for _, score, kind, snapshot, attempt_id, participant, slug in rows:
        verb = "judged" if kind is GradingKind.JUDGE else "scored"
        value = "no score" if score is None else f"{score:.3f}"
        lines.append(
            f"  live: attempt {attempt_id} ({slug}, {participant.display_name}): "
            f"{snapshot.kind.value} at {snapshot.taken_working_s / 3600:.2f} working h {verb} "
            f"{value}"
        )
    return lines, max((row[0] for row in rows), default=after)


@dataclass
class LiveDemo:
    """Set up once (idempotent), then tick; `replay_url` is the replay model's /v1 URL."""

    ctx: Context
    replay_url: str
    image: str | None = None
    backend: str = DOCKER
    backend_chosen: bool = False  # asked for with --workspaces, not the fallback
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host
    image_resolver: launch.ImageResolver = launch.default_image
    sandbox: LocalSandboxBackend | None = None
    with_participant: bool = False
    study_id: int | None = None
    errors: list[str] = field(default_factory=list)
    # Told one line per newly scored checkpoint (`baseline demo` prints them), so the terminal
    # shows the study moving, not only the libraries' logs.
    on_progress: Callable[[str], None] | None = None
    _reported: int = 0  # the last grading already told

    def __post_init__(self) -> None:
        if self.backend == SANDBOX:
            sandbox = self.sandbox or sandbox_backend(self.ctx.settings.home)
            self.backend_factory = lambda host: sandbox
            self.image = HOST_IMAGE
            register_source_finder(sandbox_source(sandbox))
        self.worker = agent_worker.Worker(self.ctx, backend_factory=self.backend_factory)
        self._stop = threading.Event()

    # -- setup --

    def setup(self) -> int:
        """The live study, its agents and their launched attempts (what is missing of them)."""
        to_launch: list[int] = []
        with self.ctx.session() as session:
            if self.backend == SANDBOX:
                if session.scalar(select(Host).where(Host.name == SANDBOX_HOST)) is None:
                    url = f"unix://{self.ctx.settings.home / 'sandbox'}"  # names it; no engine
                    host = workspaces.add_host(session, SANDBOX_HOST, url, None)
                    host.healthy = True  # the sandbox needs no engine to answer
            elif session.scalar(select(Host).where(Host.name == HOST_NAME)) is None:
                host = workspaces.add_host(session, HOST_NAME, launch.LOCAL_ENGINE, None)
                workspaces.check_host(session, host)
            study = session.scalar(select(Study).where(Study.name == LIVE_STUDY))
            if study is None:
                study = studies.create_study(
                    session,
                    studies.StudySpec(
                        name=LIVE_STUDY,
                        description=(
                            "A live demo: built-in agents work on the two demo tasks, driven by "
                            "Baseline's replay model (recorded tool calls and recorded "
                            f"judgements, no API key). {scale_words()} "
                            f"{backend_words(self.backend, self.backend_chosen)}"
                        ),
                        checkpoint_hours=CHECKPOINT_HOURS,
                        working_time_limit_hours=LIMIT_HOURS,
                        time_scale=TIME_SCALE,
                        egress_policy="none",
                        reproduction_timeout_minutes=10,
                    ),
                    actor_id=None,
                )
            self.study_id = study.id
            paper = "digits-baselines"
            orchestration.set_study_judge(
                session, study, judge_config(self.replay_url, paper), code_dev=False,
                actor_id=None,
            )  # fmt: skip
            models = agent_models()
            for task in tasks.import_demo_tasks(session, self.ctx.settings):
                if task.slug not in models:
                    continue
                if task.id not in {t.id for t in studies.study_tasks(session, study)}:
                    studies.add_task(session, study, task, None)
                model = models[task.slug]
                agent = session.scalar(
                    select(Participant).where(
                        Participant.study_id == study.id, Participant.agent_model == model
                    )
                )
                if agent is None:
                    agent = agent_enrolment.add_configuration(
                        session, study, name=f"basic agent on {task.slug} (replay)",
                        scaffold="basic", model=model, endpoint=self.replay_url,
                        settings={**ZERO_PRICE, "backoff_initial_s": 0.2, "backoff_max_s": 2.0},
                        actor_id=None, group=AGENT_GROUP, pool=True,
                    )  # fmt: skip
                    session.flush()
                    to_launch.append(studies.create_attempt(session, agent, task, None).id)
            if self.with_participant:
                to_launch.extend(self._participant_attempt(session, study))
        for attempt_id in to_launch:
            launch.launch(
                self.ctx, attempt_id, None, image=self.image,
                image_resolver=self.image_resolver, backend_factory=self.backend_factory,
            )  # fmt: skip
        assert self.study_id is not None
        return self.study_id

    def _participant_attempt(self, session: Session, study: Study) -> list[int]:
        """The demo participant's own attempt on the paper task (to open in JupyterLab), when
        the demo accounts exist and it has none yet; its clock starts at its first login."""
        email = DEMO_USERS[Role.PARTICIPANT]
        user = session.scalar(select(User).where(User.email == email))
        if user is None or session.scalar(
            select(Participant).where(
                Participant.study_id == study.id, Participant.user_id == user.id
            )
        ):
            return []
        task = next(t for t in studies.study_tasks(session, study) if t.slug == PARTICIPANT_TASK)
        participant = studies.enroll_human(session, study.id, user, None)
        attempt = studies.create_attempt(session, participant, task, None)
        attempt.working_time_limit_s = PARTICIPANT_LIMIT_HOURS * 3600.0
        session.flush()
        return [attempt.id]

    # -- running --

    def tick(self) -> None:
        """One round: drive runnable agent attempts, then reproduce and grade new snapshots."""
        self.worker.poll()
        report = orchestration.process_queue_once(self.ctx, backend_factory=self.backend_factory)
        if report is not None and report.errors:
            for error in report.errors:
                if error not in self.errors:
                    self.errors.append(error)
                    log.warning("live demo: %s", error)
        if self.on_progress is not None and self.study_id is not None:
            with self.ctx.session() as session:
                lines, self._reported = progress_lines(session, self.study_id, self._reported)
            for line in lines:
                self.on_progress(line)

    def agents_done(self) -> bool:
        with self.ctx.session() as session:
            live = session.scalars(
                select(Attempt.status)
                .join(Participant, Attempt.participant_id == Participant.id)
                .where(Attempt.study_id == self.study_id, Participant.agent_model.is_not(None))
            ).all()
        return all(s is not AttemptStatus.PENDING and s not in LIVE_ATTEMPT_STATUSES for s in live)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # keep the demo going; the failure is in the log
                log.exception("live demo tick failed")
            self._stop.wait(TICK_S)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="live-demo", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
