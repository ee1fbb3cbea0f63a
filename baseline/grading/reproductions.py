"""Reproductions in the domain: queue one per snapshot, run it in a fresh, disposable workspace.

A Reproduction row goes queued -> running -> succeeded | failed. *Succeeded* means the
reproduction was carried out and recorded, whatever reproduce.sh did: its exit code, time-out and
failure class are results the judge grades against. *Failed* means it could not be carried out
(no image, the workspace or the capture broke); its error says why, and a new one can be queued.

The workspace is placed like any other (same image digest and hardware profile as the attempt, a
host with free GPUs, the attempt's network policy) through `baseline.workspaces.workspaces`, so
GPUs stay exclusive; when no host has room the reproduction stays queued and says so. The workspace
is destroyed afterwards in every case (when its host's engine does not answer then, the gradings'
recovery job destroys it later, `claims.sweep_disposable`). While it runs, reproduce.log is
streamed to a live file the portal can show (`current_live_log`), one per claim (see below); when
it ends the capped log is a blob and the live file is removed.

One runner at a time: the scheduler's worker, `baseline reproduce` and `baseline score` (in
other processes) may all pick up the same queued row. A runner first claims it (`_claim`): one
conditional UPDATE from queued to running, atomic on SQLite and PostgreSQL alike, so a second
runner finds it claimed and gets `NotQueued` ("already running"), never a second run in a
second workspace. The claim is named by its `started_at`; everything the runner writes later
(heartbeats, the result, a failed try) is written only while the row is still running under
that claim.

A running reproduction beats a heartbeat on its row. One silent for `STALE_AFTER_S` lost its
process (killed, or its machine went down): `recover_interrupted` (at the scheduler's start,
every minute after, and in `baseline workspace reconcile`) destroys its workspace (container,
disk image, volume) and queues it again as a failed try of Baseline's own: that is how a stale
claim is taken over. Should the silent runner still live, its claim is gone: its heartbeats
and its result are not written over the run that followed, nor its live log: that file is named
by its claim, so the runner neither writes into nor removes the next run's. A runner killed
after it opened its live log leaves the file behind: recovery removes the live logs of the
claims it takes over, and a run that ends those of the claims before its own.

A runner that cannot show it is alive gives its run up before recovery may take it over
(`claims.Heartbeat`): its workspace is stopped, so reproduce.sh ends, and the runner raises
`claims.ClaimLost`, leaving the row to recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts.snapshots import capture_limits, store_for
from baseline.config import Settings
from baseline.context import Context
from baseline.errors import Conflict, NotFound
from baseline.grading.claims import (
    ClaimLost,
    Heartbeat,
    claim,
    claimed,
    not_queued,
    stale,
    take_over,
)
from baseline.grading.retries import count_failed_try
from baseline.models import (
    Attempt,
    Host,
    JobStatus,
    Reproduction,
    Snapshot,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.studies.studies import check_not_archived
from baseline.workspaces.workspaces import (
    BackendFactory,
    PlacementError,
    backend_for_host,
    destroy,
    handle_of,
    has_room_for,
    new_workspace_name,
    request_workspace,
)
from infra.blobs import BlobStore
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle
from scoring.failure import FailureClass
from scoring.reproduction import (
    ReproductionError,
    ReproductionOptions,
    ReproductionResult,
    reproduce_in_workspace,
)

log = logging.getLogger(__name__)

LIVE_LOG_DIR = "reproductions"
# The live log's bound on the portal's disk (see `_LiveLog`): head and tail of the output.
LIVE_LOG_HEAD = 1 << 20
LIVE_LOG_TAIL = 1 << 20
LIVE_LOG_REWRITE_S = 1.0
LIVE_LOG_STAMP = "%Y%m%dT%H%M%S%fZ"
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


def live_log_path(settings: Settings, reproduction_id: int, claim: datetime) -> Path:
    """The live log of one claim of the reproduction (named by its `started_at`).

    One file per claim, not per reproduction: a runner whose claim was taken over and that
    still lived removed the shared file when it ended, the log of the run that followed while
    that one ran (and one that opened it late emptied it)."""
    return settings.home / LIVE_LOG_DIR / f"{reproduction_id}-{_stamp(claim)}.log"


def _stamp(claim: datetime) -> str:
    """A claim in a live log's name; fixed width, so stamps sort as their claims."""
    return claim.astimezone(UTC).strftime(LIVE_LOG_STAMP)


def remove_live_logs(settings: Settings, reproduction_id: int, up_to: datetime) -> None:
    """Remove the live logs of the reproduction's claims up to `up_to` (that one included).

    A runner killed after it opened its live log, or one taken over before it opened it, left
    the file behind for good; the claims up to the one taken over, or to one that ended, run no
    more, and a claim that follows is later than all of them, so its log is kept."""
    last = _stamp(up_to)
    for path in (settings.home / LIVE_LOG_DIR).glob(f"{reproduction_id}-*.log"):
        stamp = path.stem.removeprefix(f"{reproduction_id}-")
        if len(stamp) == len(last) and stamp <= last:
            path.unlink(missing_ok=True)


def current_live_log(settings: Settings, row: Reproduction) -> Path | None:
    """The live log of the run going on now (its claim's), None when none runs: what the
    portal shows while no log blob is stored. The file may be absent still (or already)."""
    if row.status is not JobStatus.RUNNING or row.started_at is None:
        return None
    return live_log_path(settings, row.id, row.started_at)


def queue_reproduction(session: Session, snapshot: Snapshot, salvage: bool = False) -> Reproduction:
    """Queue a reproduction of `snapshot`; an already queued or running one is returned instead.
    None of an archived study's (`studies.check_not_archived`)."""
    check_not_archived(snapshot.attempt.study, "reproduce its snapshots")
    found = session.scalar(
        select(Reproduction).where(
            Reproduction.snapshot_id == snapshot.id, Reproduction.status.in_(ACTIVE)
        )
    )
    if found is not None:
        return found
    row = Reproduction(snapshot_id=snapshot.id, status=JobStatus.QUEUED, details={})
    row.details = {"salvage": salvage}
    session.add(row)
    session.flush()
    return row


def latest_reproduction(session: Session, snapshot_id: int) -> Reproduction | None:
    return session.scalar(
        select(Reproduction)
        .where(Reproduction.snapshot_id == snapshot_id)
        .order_by(Reproduction.id.desc())
        .limit(1)
    )


def attempt_network(session: Session, attempt: Attempt) -> str:
    """The network of the attempt's own workspace: a reproduction gets the same egress policy."""
    network = session.scalar(
        select(Workspace.network)
        .where(Workspace.attempt_id == attempt.id, Workspace.purpose == WorkspacePurpose.ATTEMPT)
        .order_by(Workspace.id.desc())
        .limit(1)
    )
    return network or "none"


@dataclass
class Placed:
    """A disposable workspace that is running: its row id, backend and handle."""

    workspace_id: int
    backend: WorkspaceBackend
    handle: WorkspaceHandle


class NoRoom(Conflict):
    """No host can take the workspace now; the job stays queued."""

    @classmethod
    def for_purpose(cls, purpose: WorkspacePurpose) -> NoRoom:
        """What a job that waits for room says, the same on every try: a job already saying it
        may ask again read only (`script_scoring`)."""
        return cls(
            f"no workspace for the {purpose.value}: no enabled, healthy host has room for it now"
        )


@contextmanager
def disposable_workspace(
    ctx: Context,
    *,
    image: str,
    hardware_profile: str,
    purpose: WorkspacePurpose,
    network: str,
    backend_factory: BackendFactory,
    on_named: Callable[[str], None] | None = None,
) -> Iterator[Placed]:
    """Place a workspace for one job, yield it, and destroy it afterwards whatever happened.

    `on_named` is told the workspace's name before its row is made, for the job to name it on
    its own row: a job whose process dies once the workspace stands has named it already, and
    recovery removes it (`claims.remove_workspace`). Raises NoRoom, having written nothing, when
    no host has room for it now (`has_room_for`)."""
    with ctx.session() as session:
        if not has_room_for(session, hardware_profile):
            raise NoRoom.for_purpose(purpose)
    name = new_workspace_name(purpose)
    if on_named is not None:
        on_named(name)
    with ctx.session() as session:
        workspace = request_workspace(
            session,
            image=image,
            hardware_profile=hardware_profile,
            purpose=purpose,
            network=network,
            name=name,
            backend_factory=backend_factory,
        )
        if workspace.status is not WorkspaceStatus.RUNNING:
            reason = workspace.last_error or "no enabled, healthy host has room for it"
            # Never leave it pending: reconcile would place it later, for nobody.
            destroy(session, workspace, backend_factory)
            raise NoRoom(f"no workspace for the {purpose.value}: {reason}")
        host = session.get(Host, workspace.host_id)
        assert host is not None
        backend = backend_factory(host)
        placed = Placed(workspace.id, backend, handle_of(workspace))
    try:
        yield placed
    finally:
        try:
            destroy_or_leave(ctx, placed.workspace_id, backend_factory)
        finally:
            close = getattr(backend, "close", None)
            if callable(close):
                close()


def destroy_or_leave(ctx: Context, workspace_id: int, backend_factory: BackendFactory) -> None:
    """Destroy a job's disposable workspace as the job ends; one whose host's engine does not
    answer now is logged and left live for `claims.sweep_disposable` to retry. Raising here,
    in a `finally`, hid the job's own error behind the engine's."""
    try:
        with ctx.session() as session:
            row = session.get(Workspace, workspace_id)
            if row is not None:
                destroy(session, row, backend_factory)
    except (PlacementError, WorkspaceError) as exc:
        log.warning("workspace %s not destroyed now, left to the sweep: %s", workspace_id, exc)


class _LiveLog:
    """reproduce.log as it is written, for the portal; removed once the blob is stored.

    Bounded on the portal's disk whatever reproduce.sh prints (a participant's script printing
    1 GiB must not fill the disk that holds the database and the blobs): the first
    `LIVE_LOG_HEAD` bytes as they came, then a line saying how much was left out, then the
    latest `LIVE_LOG_TAIL` bytes, kept here and written out at most every `LIVE_LOG_REWRITE_S`
    (and at once when the head is full), so that the file stays under head + tail + a line.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.handle: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.written = 0  # bytes of the head in the file
        self.tail = bytearray()
        self.omitted = 0  # bytes between the head and the tail
        self.rewritten_at = 0.0

    def write(self, chunk: bytes) -> None:
        room = LIVE_LOG_HEAD - self.written
        if room > 0:
            self.handle.write(chunk[:room])
            self.handle.flush()
            self.written += min(room, len(chunk))
            chunk = chunk[room:]
            if not chunk:
                return
        self.tail += chunk
        if len(self.tail) > LIVE_LOG_TAIL:
            cut = len(self.tail) - LIVE_LOG_TAIL
            self.omitted += cut
            del self.tail[:cut]
        now = time.monotonic()
        if now - self.rewritten_at >= LIVE_LOG_REWRITE_S:
            self._write_tail()
            self.rewritten_at = now

    def _write_tail(self) -> None:
        self.handle.seek(self.written)
        self.handle.truncate()
        if self.omitted:
            self.handle.write(f"\n[... {self.omitted} bytes left out ...]\n".encode())
        self.handle.write(self.tail)
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)


def _start(session: Session, reproduction_id: int) -> tuple[Reproduction, Snapshot, Attempt]:
    row = _row(session, reproduction_id)
    if row.status is not JobStatus.QUEUED:
        raise not_queued(row)
    snapshot = row.snapshot
    attempt = snapshot.attempt
    return row, snapshot, attempt


def _claim(ctx: Context, reproduction_id: int, image: str, profile: str) -> datetime:
    """Take the queued reproduction for this runner (`claims.claim`): of two runners that both
    read it queued, only one places a workspace and runs reproduce.sh."""
    return claim(
        ctx, Reproduction, reproduction_id, image_digest=image, hardware_profile=profile, error=None
    )


def _claimed(session: Session, reproduction_id: int, claim: datetime) -> Reproduction | None:
    """The row while it is still running under this runner's `claim`, else None."""
    row: Reproduction | None = claimed(session, Reproduction, reproduction_id, claim)
    return row


def _finish_failed(ctx: Context, reproduction_id: int, error: str) -> None:
    """A failure no retry can mend (the attempt never started): failed at once."""
    with ctx.session() as session:
        row = _row(session, reproduction_id)
        row.status = JobStatus.FAILED
        row.error = error[:4000]
        row.finished_at = utcnow()
        audit.record(session, "reproduction.failed", "reproduction", row.id, None, error=error)


def _baseline_failed(ctx: Context, reproduction_id: int, claim: datetime, error: str) -> None:
    """Baseline's own failure (the workspace, the engine, the worker): says nothing about the
    submission, so the worker tries it again (`baseline.grading.retries`), and only then is it
    failed."""
    with ctx.session() as session:
        row = _claimed(session, reproduction_id, claim)
        if row is None:
            return
        row.started_at = None
        count_failed_try(row, error[:4000])
        if row.status is JobStatus.FAILED:
            audit.record(
                session, "reproduction.failed", "reproduction", row.id, None, error=row.error
            )


def run_reproduction(
    ctx: Context,
    reproduction_id: int,
    *,
    backend_factory: BackendFactory = backend_for_host,
    store: BlobStore | None = None,
) -> Reproduction:
    """Run one queued reproduction to its end; returns the row as it was left.

    Whatever goes wrong once the row is running (a broken workspace, a failed capture, even a
    MemoryError) ends it as failed with its error: a row is never left running by this process.
    A reproduction another runner has claimed raises `NotQueued` (see the module).
    """
    store = store or store_for(ctx)
    with ctx.session() as session:
        row, snapshot, attempt = _start(session, reproduction_id)
        manifest = snapshot.manifest_sha256
        image = attempt.image_digest
        profile = attempt.hardware_profile
        network = attempt_network(session, attempt)
        options = ReproductionOptions(
            timeout_s=attempt.study.reproduction_timeout_minutes * 60,
            salvage=bool(row.details.get("salvage")),
            # The executed directory drops caches and environments whatever the study's policy
            # (the run may make a venv); the installation's bounds hold as for snapshots.
            limits=capture_limits(ctx.settings, None),
        )
    if image is None:
        _finish_failed(
            ctx, reproduction_id, f"attempt {attempt.id} has no pinned image: it never started"
        )
        return _get(ctx, reproduction_id)
    claim = _claim(ctx, reproduction_id, image, profile)
    try:
        live = _LiveLog(live_log_path(ctx.settings, reproduction_id, claim))
    except OSError as exc:
        _baseline_failed(ctx, reproduction_id, claim, f"the live log cannot be written: {exc}")
        return _get(ctx, reproduction_id)

    def named(name: str) -> None:  # before it stands: a runner dying once it does named it
        with ctx.session() as session:
            claimed = _claimed(session, reproduction_id, claim)
            if claimed is not None:
                claimed.details = {**claimed.details, "workspace": name}

    try:
        with (
            Heartbeat(ctx, Reproduction, reproduction_id, claim) as heartbeat,
            disposable_workspace(
                ctx,
                image=image,
                hardware_profile=profile,
                purpose=WorkspacePurpose.REPRODUCTION,
                network=network,
                backend_factory=backend_factory,
                on_named=named,
            ) as placed,
        ):
            backend = heartbeat.guard(placed.backend, placed.handle)
            result = reproduce_in_workspace(
                backend, placed.handle, store, manifest, options, on_output=live.write
            )
    except ClaimLost:  # given up: the row is recovery's
        raise
    except NoRoom as exc:
        with ctx.session() as session:
            waiting = _claimed(session, reproduction_id, claim)
            if waiting is not None:
                waiting.status = JobStatus.QUEUED
                waiting.started_at = None
                waiting.details = {**waiting.details, "waiting": str(exc)}
        return _get(ctx, reproduction_id)
    except (ReproductionError, PlacementError) as exc:
        _baseline_failed(ctx, reproduction_id, claim, str(exc))
        return _get(ctx, reproduction_id)
    except Exception as exc:  # anything else, MemoryError included: a failure with its error
        log.exception("reproduction %s crashed", reproduction_id)
        _baseline_failed(ctx, reproduction_id, claim, f"{type(exc).__name__}: {exc}")
        return _get(ctx, reproduction_id)
    finally:
        live.close()
        remove_live_logs(ctx.settings, reproduction_id, claim)
    try:
        _finish_succeeded(ctx, reproduction_id, claim, result, options.salvage)
    except Exception as exc:  # e.g. the result could not be stored
        log.exception("reproduction %s could not be recorded", reproduction_id)
        _baseline_failed(ctx, reproduction_id, claim, f"recording the result failed: {exc!r}")
    return _get(ctx, reproduction_id)


def _finish_succeeded(
    ctx: Context,
    reproduction_id: int,
    claim: datetime,
    result: ReproductionResult,
    salvage: bool,
) -> None:
    with ctx.session() as session:
        row = _claimed(session, reproduction_id, claim)
        if row is None:
            return
        row.status = JobStatus.SUCCEEDED
        row.finished_at = utcnow()
        row.exit_code = result.exit_code
        row.duration_s = result.duration_s
        row.timed_out = result.timed_out
        row.failure_class = result.failure_class
        row.log_sha256 = result.log_sha256
        row.executed_manifest_sha256 = result.executed_manifest_sha256
        row.salvage_used = result.salvage_used
        details = result.model_dump(mode="json")
        details["salvage"] = salvage
        details["workspace"] = row.details.get("workspace")
        row.details = details
        audit.record(
            session,
            "reproduction.done",
            "reproduction",
            row.id,
            None,
            exit_code=result.exit_code,
            failure_class=result.failure_class,
        )


def reproduction_status(row: Reproduction) -> str:
    """What a reproduction came to, as tables and exports name it: "succeeded" only when
    reproduce.sh ran clean. The row's own status says whether Baseline carried the run out
    (succeeded even when the script was missing or failed), which read as a clean run in the
    results; a script that failed is named by its failure class ("missing_reproduce_sh",
    "timeout", "script_error", ...), a run Baseline could not carry out "failed", one not over
    "queued" or "running"."""
    if row.status is not JobStatus.SUCCEEDED:
        return row.status.value
    if row.failure_class is not None:
        return row.failure_class
    if row.timed_out:
        return FailureClass.TIMEOUT.value
    if row.exit_code != 0:
        return FailureClass.SCRIPT_ERROR.value
    return JobStatus.SUCCEEDED.value


def _row(session: Session, reproduction_id: int) -> Reproduction:
    row = session.get(Reproduction, reproduction_id)
    if row is None:
        raise NotFound(f"no reproduction {reproduction_id}")
    return row


def _get(ctx: Context, reproduction_id: int) -> Reproduction:
    with ctx.session() as session:
        return _row(session, reproduction_id)


def recover_interrupted(
    ctx: Context,
    *,
    backend_factory: BackendFactory = backend_for_host,
    now: datetime | None = None,
) -> list[int]:
    """Reproductions left running by a process that stopped (no heartbeat for `STALE_AFTER_S`):
    each one's workspace is destroyed and its live logs removed, and it is queued again as a
    failed try (after `MAX_TRIES` it fails, shown as missing). Returns their ids.

    A reproduction whose workspace cannot be destroyed now (its host is down) is left as it is,
    so that the next round tries again: queued first, nothing would ever remove that workspace.
    """
    now = now or utcnow()
    recovered: list[int] = []
    with ctx.session() as session:
        for row in stale(session, Reproduction, now):
            claim = row.started_at
            if not take_over(session, row, row.details.get("workspace"), backend_factory, now):
                continue
            if claim is not None:
                remove_live_logs(ctx.settings, row.id, claim)
            row.details = {**row.details, "interrupted": True}
            recovered.append(row.id)
    return recovered


def recover_job(ctx: Context) -> list[int]:
    """The scheduler's periodic entry point (and the first thing it does when it starts)."""
    recovered = recover_interrupted(ctx)
    if recovered:
        log.warning("recovered interrupted reproductions: %s", recovered)
    return recovered
