"""An attempt's workspace held still: a human's during a person's pause and after the end, an
agent's stopped after the end.

While the participant or the study team pauses a human's clock (`clock.HELD_REASONS`), every
process of the workspace user is stopped (`hold`, SIGSTOP) and continued when the pause ends
(`release`, SIGCONT): what the clock does not count cannot run, and the Lab, its terminals,
kernels and background jobs keep their state across the pause.

When a human attempt ends (its limit, its wall-clock cap, or a submission) its final snapshot has
been taken already (`baseline.attempts.schedule.finish`); what is left is to make sure nothing
changes afterwards: the JupyterLab server is stopped through the hub, every process of the
workspace user is killed (a kernel still busy with a training run included), and the submission
directory loses its write permissions. The container itself keeps running (Baseline's reconcile
would restart a stopped one, and coordinators may still look inside), and the hub refuses to start
a server for an ended attempt, saying why (`baseline.hub.hub_sessions.openable_attempt`).

Root inside a workspace has no capability to signal or chmod the workspace user's files, so
both steps run as that user. The container's init (pid 1) and main process (its first child) are
spared: killing them would stop the container. Like a teardown hook, a failure here cannot undo
the end of the attempt: it is recorded in the audit log and returned, never raised.

An agent's workspace has no one to look inside it while it runs, and it holds what a running
container holds (its GPUs above all) for as long as it runs. So once no agent will work in it
again (its attempt ended, or its run failed: no attempt gets a second run) it is stopped
(`stop_agent_workspace`): its terminal records collected, the container stopped with its
submission volume kept (snapshots still read it while the attempt's clock runs on), its GPUs
freed.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    Host,
    HubLoginToken,
    ParticipantKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import backends, terminal_records, workspaces
from infra.hub import hub_api
from infra.hub.names import hub_username, server_name
from infra.workspace import PARTICIPANT_USER, SUBMISSION_DIR, WorkspaceError

log = logging.getLogger(__name__)

# An agent's workspace that may still run, or be placed or restarted by reconcile.
_STOPPABLE = (
    WorkspaceStatus.PENDING,
    WorkspaceStatus.CREATING,
    WorkspaceStatus.RUNNING,
    WorkspaceStatus.DEAD,
)

# The participant's processes, as the workspace user sees them in /proc; the common head of the
# scripts below. `spared`: init, the container's main process (its first child), this script and
# its callers (the exec's `timeout` and shell end by themselves). A raw string: the script itself
# splits a command line at its NUL bytes, which must reach Python as `\0`, not as a NUL that
# `docker exec` refuses in an argument.
_PROCESSES = r"""
import os, signal, sys, time
TASK_CLI = b'/usr/local/bin/task'
uid, me = os.getuid(), os.getpid()
def states():
    found = {}
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            if os.stat('/proc/' + name).st_uid != uid:
                continue
            with open('/proc/%s/stat' % name) as handle:
                state, parent = handle.read().rsplit(')', 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        if state != 'Z':
            found[int(name)] = (int(parent), state)
    return found
def mine():
    return {pid: parent for pid, (parent, _) in states().items()}
def asks_the_portal(pid):
    try:
        with open('/proc/%s/cmdline' % pid, 'rb') as handle:
            argv = handle.read().split(b'\0')
    except OSError:
        return False
    return TASK_CLI in argv[:2]
first = mine()
main = min((p for p, parent in first.items() if parent == 1), default=None)
spared = {1, me, main}
pid = first.get(me)
while pid in first and pid not in spared:
    spared.add(pid)
    pid = first[pid]
"""

# Run as the workspace user: SIGKILL every process of that user but the spared, three rounds (to
# catch what was forking meanwhile). A `task submit` that ended the attempt is spared with its
# parents, so that it reads the portal's answer; the final snapshot is taken already, and it
# exits by itself. It exits 1 naming what still runs after the rounds (a zombie has ended: it
# only waits for its parent to reap it).
KILL_ALL = (
    _PROCESSES
    + r"""
for pid in [p for p in first if asks_the_portal(p)]:
    while pid in first and pid not in spared:
        spared.add(pid)
        pid = first[pid]
for _ in range(3):
    for pid in mine():
        if pid not in spared:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.2)
left = sorted(p for p in mine() if p not in spared)
if left:
    print('still running after SIGKILL: pids %s' % left)
    sys.exit(1)
"""
)

# Run as the workspace user when a pause holds the workspace: SIGSTOP every process of that user
# but the spared, the JupyterLab server with its terminals and kernels included, three rounds. A
# `task pause` that asked for the pause is spared, so that it reads the portal's answer and exits:
# with its callers when it came through `docker exec` (parent 0: the exec ends by itself), alone
# when it was typed in a Lab terminal (its shell and the server stop with the rest). Exits 1
# naming what is not stopped after the rounds.
HOLD_ALL = (
    _PROCESSES
    + r"""
for pid in [p for p in first if asks_the_portal(p)]:
    chain = []
    while pid in first and pid not in spared:
        chain.append(pid)
        pid = first[pid]
    spared.update(chain if pid == 0 else chain[:1])
for _ in range(3):
    for pid in mine():
        if pid not in spared:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
    time.sleep(0.2)
left = sorted(p for p, (_, state) in states().items() if p not in spared and state not in 'Tt')
if left:
    print('still running after SIGSTOP: pids %s' % left)
    sys.exit(1)
"""
)

# Run as the workspace user when the held pause ends: SIGCONT every process of that user, in
# rounds until none is stopped. Rounds, because a terminal's recorder (`script`) that wakes to
# the news that its shell had stopped stops itself again (it waits to be continued, then
# continues the shell). Exits 1 naming what is still stopped after five rounds.
RELEASE_ALL = (
    _PROCESSES
    + r"""
def stopped():
    return sorted(p for p, (_, state) in states().items() if p not in spared and state in 'Tt')
for _ in range(5):
    for pid in mine():
        if pid not in spared:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    time.sleep(0.2)
    if not stopped():
        break
left = stopped()
if left:
    print('still stopped after SIGCONT: pids %s' % left)
    sys.exit(1)
"""
)


def freeze(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> str | None:
    """Stop the server and the participant's processes, make the submission read-only.

    Returns what failed (also in the audit log), or None when all was done or nothing applied
    (a live attempt, no running workspace). The hub is asked only about attempts that were
    opened in it. An agent's attempt has its workspace stopped instead (`stop_agent_workspace`).
    """
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or attempt.status in LIVE_ATTEMPT_STATUSES:
            return None
        human = attempt.participant.kind is ParticipantKind.HUMAN
    if not human:
        return stop_agent_workspace(ctx, attempt_id, backend_factory)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        user_id = attempt.participant.user_id
        workspace = workspaces.running_attempt_workspace(session, attempt_id)
        if workspace is None:
            return None
        host = session.get(Host, workspace.host_id)
        handle = workspaces.handle_of(workspace)
        used_hub = session.scalar(
            select(HubLoginToken.id)
            .where(HubLoginToken.attempt_id == attempt_id, HubLoginToken.used_at.is_not(None))
            .limit(1)
        )
    problems: list[str] = []
    recorded: list[terminal_records.Collected] = []
    server_stopped = False
    config = hub_config(ctx.settings)
    if used_hub and user_id is not None and hub_api.hub_is_up(config.public_url):
        try:
            server_stopped = hub_api.stop_server(
                config.public_url,
                config.service_token(),
                hub_username(user_id),
                server_name(attempt_id),
            )
        except hub_api.HubUnreachable as exc:
            problems.append(f"stopping the JupyterLab server: {exc}")
    if host is not None:
        try:
            with backends.open_backend(backend_factory, host) as backend:
                kill = ["python3", "-c", KILL_ALL]
                killed = backend.exec(handle, kill, user=PARTICIPANT_USER, timeout_s=30)
                if killed.exit_code != 0:
                    problems.append(
                        "ending the participant's processes: "
                        + killed.output.decode(errors="replace")[-300:]
                    )
                done = backend.exec(
                    handle,
                    ["chmod", "-R", "a-w", SUBMISSION_DIR],
                    user=PARTICIPANT_USER,
                    timeout_s=300,
                )
                if done.exit_code != 0:
                    problems.append(
                        "making the submission read-only: "
                        + done.output.decode(errors="replace")[-300:]
                    )
                # After the kill: every session has ended, its recording is complete.
                recorded = terminal_records.read_from(backend, handle)
        except (WorkspaceError, workspaces.PlacementError) as exc:
            problems.append(f"freezing the workspace: {exc}")
    with ctx.session() as session:
        _keep(session, attempt_id, recorded, problems, "workspace.freeze_failed")
        if not problems:
            audit.record(
                session,
                "workspace.freeze",
                "attempt",
                attempt_id,
                None,
                workspace=handle.name,
                server_stopped=server_stopped,
            )
    return "; ".join(problems) or None


def hold(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> str | None:
    """Stop (SIGSTOP) every process of a human's workspace while a person's pause is open.

    Working time is what the participant could work: with the JupyterLab server, its terminals,
    its kernels and every background job stopped, nothing runs and nothing is written during the
    pause, so nothing done "while paused" reaches a snapshot at the paused working time. The
    processes keep their state and go on at `release`; a line typed into an open Lab terminal
    meanwhile waits for the stopped server and runs after the resume, on the running clock.
    Returns what failed (also in the audit log, ``workspace.hold_failed``), or None when all was
    done or nothing applied (an agent's attempt, no running workspace)."""
    return _signal_all(ctx, attempt_id, HOLD_ALL, "workspace.hold", backend_factory)


def release(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> str | None:
    """Continue (SIGCONT) the processes `hold` stopped, when the held pause ends.

    A job the participant had stopped themselves (Ctrl-Z) is continued too: the workspace user's
    processes carry no mark of who stopped them. Returns what failed, like `hold`."""
    return _signal_all(ctx, attempt_id, RELEASE_ALL, "workspace.release", backend_factory)


def _signal_all(
    ctx: Context,
    attempt_id: int,
    script: str,
    event: str,
    backend_factory: workspaces.BackendFactory,
) -> str | None:
    """Run a signalling script as the workspace user in a human's running workspace; audited
    as ``event`` with its output, or ``event``_failed with what failed."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or attempt.participant.kind is not ParticipantKind.HUMAN:
            return None
        workspace = workspaces.running_attempt_workspace(session, attempt_id)
        if workspace is None:
            return None
        host = session.get(Host, workspace.host_id)
        handle = workspaces.handle_of(workspace)
    if host is None:
        return None
    problem: str | None = None
    try:
        with backends.open_backend(backend_factory, host) as backend:
            done = backend.exec(
                handle, ["python3", "-c", script], user=PARTICIPANT_USER, timeout_s=30
            )
        if done.exit_code != 0:
            problem = (
                f"{event} (exit {done.exit_code}): " + done.output.decode(errors="replace")[-300:]
            )
    except (WorkspaceError, workspaces.PlacementError) as exc:
        problem = f"{event}: {exc}"
    with ctx.session() as session:
        if problem is None:
            audit.record(session, event, "attempt", attempt_id, None, workspace=handle.name)
        else:
            log.warning("attempt %s: %s", attempt_id, problem)
            audit.record(session, f"{event}_failed", "attempt", attempt_id, None, errors=problem)
    return problem


def stop_agent_workspace(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> str | None:
    """Stop the workspaces of an agent's attempt that no agent will work in again: their terminal
    records collected first (a stopped container's /home/logs is gone), then each stopped with
    its submission volume kept and its GPUs freed (`workspaces.stop`).

    Returns what failed (also in the audit log, ``workspace.stop_failed``), or None when all was
    done or nothing applied (a human's attempt, no workspace left to stop)."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or attempt.participant.kind is not ParticipantKind.AGENT:
            return None
        rows = session.scalars(
            select(Workspace).where(
                Workspace.attempt_id == attempt_id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status.in_(_STOPPABLE),
            )
        ).all()
        workspace_ids = [w.id for w in rows]
        running = [
            (host, workspaces.handle_of(w))
            for w in rows
            if w.status is WorkspaceStatus.RUNNING
            and w.host_id is not None
            and (host := session.get(Host, w.host_id)) is not None
        ]
    if not workspace_ids:
        return None
    problems: list[str] = []
    recorded: list[terminal_records.Collected] = []
    for host, handle in running:
        try:
            with backends.open_backend(backend_factory, host) as backend:
                recorded.extend(terminal_records.read_from(backend, handle))
        except (WorkspaceError, workspaces.PlacementError) as exc:
            problems.append(f"collecting the terminal records of {handle.name}: {exc}")
    with ctx.session() as session:
        for workspace_id in workspace_ids:
            workspace = session.get(Workspace, workspace_id)
            assert workspace is not None
            try:
                workspaces.stop(session, workspace, backend_factory)
            except workspaces.PlacementError as exc:
                problems.append(str(exc))
        _keep(session, attempt_id, recorded, problems, "workspace.stop_failed")
    return "; ".join(problems) or None


def _keep(
    session: Session,
    attempt_id: int,
    recorded: list[terminal_records.Collected],
    problems: list[str],
    failed_event: str,
) -> None:
    """Store the terminal records collected, and audit what could not be done (logged too)."""
    if recorded:
        terminal_records.store(session, attempt_id, recorded)
    if problems:
        log.warning("attempt %s: %s: %s", attempt_id, failed_event, problems)
        audit.record(
            session, failed_event, "attempt", attempt_id, None, errors="; ".join(problems)[:2000]
        )
