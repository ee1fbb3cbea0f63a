"""What a new attempt's submission holds before the clock starts.

A score over working time needs a t = 0 that means the same for everyone: the task's starting
point. A scored task (RE-Bench style) starts from its starting solution, so its ``starting_files``
are copied into the submission and the start snapshot scores the starting score (normalised 0)
instead of failing on an empty folder; an EXP-Bench task starts from its masked repository
(`baseline.tasks.expbench.seed_submission`). Starting files are copied once, before the attempt
starts: a workspace re-created after the start keeps the participant's submission as it is.
"""

from __future__ import annotations

import shlex

from sqlalchemy.orm import Session

from baseline.models import Attempt, TaskKind, Workspace, WorkspacePurpose
from baseline.tasks import expbench
from infra.workspace import (
    PAPER_DIR,
    SUBMISSION_DIR,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
)


def starting_files_script(starting_files: str, submission: str = SUBMISSION_DIR) -> str:
    """Copy the task's starting files (a folder's contents, or one file) into an empty
    submission (its git repository aside); a submission that holds anything already is left
    alone. Nothing is committed: the participant's history is theirs."""
    source = shlex.quote(f"{PAPER_DIR.rstrip('/')}/{starting_files.strip('/')}")
    return (
        f"set -e; cd {shlex.quote(submission)}; "
        'if [ -n "$(ls -A . | grep -vx .git)" ]; then exit 0; fi; '
        f"if [ -d {source} ]; then cp -R {source}/. .; "
        f"elif [ -f {source} ]; then cp {source} .; "
        f"else echo 'the starting files {starting_files} are not in the workspace' >&2; "
        "exit 1; fi"
    )


def seed_submission(
    session: Session, workspace: Workspace, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> None:
    """Put the task's starting point into a new attempt workspace's submission (a no-op for other
    workspaces and for an attempt that has started)."""
    if workspace.purpose is not WorkspacePurpose.ATTEMPT or workspace.attempt_id is None:
        return
    attempt = session.get(Attempt, workspace.attempt_id)
    if attempt is None:
        return
    if attempt.task.kind is TaskKind.EXPBENCH:  # idempotent: it skips a repository with a commit
        expbench.seed_submission(session, workspace, backend, handle)
        return
    starting = (attempt.task.scoring or {}).get("starting_files")
    if attempt.task.kind is not TaskKind.SCORED or not starting or attempt.started_at is not None:
        return
    script = starting_files_script(str(starting))
    result = backend.exec(handle, ["bash", "-c", script], workdir=SUBMISSION_DIR, timeout_s=300)
    if result.exit_code != 0:
        output = result.output.decode(errors="replace").strip()[-500:]
        raise WorkspaceError(f"copying the starting files into the submission failed: {output}")
