"""The workspace backend contract.

A workspace is one isolated machine (a container, or a sandbox) in which a participant, an agent,
a reproduction or a scoring script works. Backends (Docker local, Docker over SSH, local sandbox)
implement `WorkspaceBackend`; the domain layer only talks to this Protocol. Layout inside every
workspace: task files read-only at /home/paper, the submission git repository at
/home/submission (persisted outside the workspace so it outlives it), logs at /home/logs.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

PAPER_DIR = "/home/paper"
SUBMISSION_DIR = "/home/submission"
# The unprivileged account every workspace image has: participants, agents and the hub run as it.
PARTICIPANT_USER = "participant"
LOGS_DIR = "/home/logs"


@dataclass(frozen=True)
class HardwareProfile:
    """What a workspace gets; identical for every participant of a study."""

    name: str
    cpus: float = 1.0
    memory_mb: int = 2048
    shm_mb: int = 64
    pids: int = 512
    disk_gb: float | None = None  # GB of 2**30 bytes; a fraction gives a small test quota
    gpu_model: str | None = None
    gpu_count: int = 0


@dataclass(frozen=True)
class WorkspaceSpec:
    """Everything needed to create a workspace; two equal specs give identical workspaces."""

    name: str
    image: str
    profile: HardwareProfile
    labels: Mapping[str, str] = field(default_factory=dict)
    task_dir: Path | None = None  # mounted read-only at PAPER_DIR; never holds the rubric
    network: str = "none"  # "none", "open", or the name of an egress-filtered network
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_device_ids: Sequence[str] = ()
    submission_volume: str | None = None  # reuse an existing submission store (restart)


# A tar to copy into a workspace: whole, or a file read from where it stands (a snapshot is
# streamed from a temporary file, never held whole in memory).
Archive = bytes | BinaryIO


class WorkspaceError(RuntimeError):
    """A backend operation failed for a reason worth showing (missing image, engine down...)."""


class WorkspaceState(enum.StrEnum):
    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"
    MISSING = "missing"


DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024
# A workspace being created is not in the live set until its creator's transaction commits (the
# row is written in the same transaction as the container is made): a reconcile in another
# process or thread in between took a reproduction's fresh container for an orphan and removed
# it mid-start ("cannot exec in a stopped container"). Younger workspaces are left to the next
# reconcile; creation takes seconds, and ten minutes leave room for a large copy to a far host.
ORPHAN_MIN_AGE_S = 600.0
"""Output an exec keeps (it streams everything): enough for a reproduce.sh log, bounded memory."""


@dataclass(frozen=True)
class WorkspaceHandle:
    name: str
    backend: str
    container_id: str
    image_digest: str | None
    submission_volume: str


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed at its timeout
    output: bytes
    timed_out: bool
    duration_s: float
    truncated: bool = False


OutputSink = Callable[[bytes], None]


@runtime_checkable
class WorkspaceBackend(Protocol):
    """The plug-in contract every workspace backend implements."""

    name: str

    def create(self, spec: WorkspaceSpec) -> WorkspaceHandle: ...

    def start(self, handle: WorkspaceHandle) -> None: ...

    def exec(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        workdir: str | None = None,
        on_output: OutputSink | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult: ...

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: Archive) -> None: ...

    def get_archive(self, handle: WorkspaceHandle, path: str) -> bytes: ...

    def status(self, handle: WorkspaceHandle) -> WorkspaceState: ...

    def stop(self, handle: WorkspaceHandle) -> None: ...

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None: ...

    def reconcile(self, live_names: set[str], *, min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
        """Remove this backend's workspaces whose name is not in live_names and that were
        created at least `min_age_s` ago; return them."""
        ...
