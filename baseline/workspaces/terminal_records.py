"""What a human did in the workspace, on record: terminal sessions, shell history, consent.

As Inspect's human agent does, every interactive shell of the workspace user runs under
``script -q -f``, which writes the whole session (what was typed and what came back) to a file
under /home/logs/terminal; bash appends each command to /home/logs/shell_history as it runs
(``history -a``), with timestamps. The wrapper is placed as root in /etc when an attempt's
container is created (`place_in_workspace`), so the participant cannot edit it; JupyterLab's
terminals are login shells, which read /etc/profile, and Debian's /etc/profile reads
/etc/bash.bashrc, so both entry points lead to it. The recordings are collected through the
workspace backend (as the blacklist monitor reads the shell history) when the attempt's workspace
is frozen at the end and whenever a coordinator asks, and kept with the attempt
(`TerminalRecording`): coordinators see them on the attempt's timeline, graders never do. With
them comes the recorder's list of recordings that ended while their shell still ran (a sender
killed: `terminal_recorder.GAPS_FILE`), shown above the recordings (`interruptions`) and audited
(``terminal.interrupted``) when first collected.

The participant is told so before anything is recorded: the study's consent text (or the default
below) must be accepted in the portal, once per enrolment, before "Open workspace" works.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import Conflict
from baseline.models import (
    Host,
    Participant,
    ParticipantKind,
    TerminalRecording,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import terminal_recorder
from baseline.workspaces.backends import BackendFactory, handle_of, open_backend
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle

DEFAULT_CONSENT_TEXT = (
    "This study measures how people work on research tasks. While you work in your workspace, "
    "Baseline records everything that happens in its terminals (what you type and what is "
    "printed, as a session recording) and your shell history, together with the snapshots of "
    "your submission and your working time. The study's coordinators can read these records; "
    "graders who score your submission cannot. The records are kept with your attempt for the "
    "study's analysis. By accepting, you agree to this recording."
)

# Written by the root recorder (`baseline.workspaces.terminal_recorder`), which the participant
# can read but not write; the fallbacks under /home/logs are the participant's own files, used
# only while the recorder does not answer.
RECORD_DIR = terminal_recorder.TERMINAL_DIR
HISTORY_FILE = terminal_recorder.HISTORY_FILE
GAPS_FILE = terminal_recorder.GAPS_FILE
FALLBACK_RECORD_DIR = terminal_recorder.FALLBACK_TERMINAL_DIR
FALLBACK_HISTORY_FILE = terminal_recorder.FALLBACK_HISTORY_FILE
SESSION_DIRS = (RECORD_DIR, FALLBACK_RECORD_DIR)
# Each file is kept up to this size; a longer one keeps its end (the latest work).
MAX_FILE_BYTES = 4 << 20
MAX_FILES = 200
SNIPPET_PATH = "/etc/baseline-record.sh"
RECORDER_PATH = "/etc/baseline-recorder.py"
SOCKET_PATH = terminal_recorder.SOCKET_PATH
# Its own session: the terminal's hang-up and Ctrl-C, which end the shell, leave it to finish.
_SEND = f"setsid python3 {RECORDER_PATH} send"

# POSIX sh: runs in dash (sh -l) and bash alike. Outside `script`, an interactive shell on a
# terminal replaces itself with `script` running bash, whose typescript goes through a FIFO to the
# root recorder (a file of the recorder's, not the participant's); inside it (BASELINE_RECORDING
# set) bash gets the history settings and sends each new command to the recorder as it runs
# (`history -a` into the recorder's pipe; process substitution is bash's, hence the eval). The
# pipe's sender is forked with the hang-up and Ctrl-C ignored (bash keeps ignored signals in its
# children): a shell that runs `exit` before its sender has started would otherwise take the
# sender, and the commands in its pipe, with it when the terminal hangs up.
# Without a recorder socket both fall back to files under /home/logs.
RECORD_SNIPPET = f"""# Baseline: terminal sessions here are recorded (the participant consented).
case $- in
*i*)
  if [ -z "${{BASELINE_RECORDING-}}" ] && [ -t 0 ] && command -v script >/dev/null 2>&1; then
    BASELINE_RECORDING=1; export BASELINE_RECORDING
    if [ -x /bin/bash ]; then SHELL=/bin/bash; export SHELL; fi
    if [ -S {SOCKET_PATH} ] && __bl_fifo=$(mktemp -u /tmp/.baseline-typescript.XXXXXX) \
       && mkfifo -m 600 "$__bl_fifo"; then
      ({_SEND} session "$__bl_fifo" </dev/null >/dev/null 2>&1 &)
      exec script -q -f "$__bl_fifo"
    fi
    if mkdir -p {FALLBACK_RECORD_DIR} 2>/dev/null; then
      exec script -q -f "{FALLBACK_RECORD_DIR}/$(date -u +%Y%m%dT%H%M%SZ)-$$.typescript"
    fi
  fi
  if [ -n "${{BASH_VERSION-}}" ]; then
    HISTFILE={FALLBACK_HISTORY_FILE}; HISTTIMEFORMAT='%F %T '; HISTSIZE=100000
    HISTFILESIZE=100000
    shopt -s histappend
    trap '' HUP INT
    if [ -S {SOCKET_PATH} ] && eval 'exec 9> >(exec {_SEND} history 2>/dev/null)'; then
      trap - HUP INT
      PROMPT_COMMAND="history -a /dev/fd/9${{PROMPT_COMMAND:+; $PROMPT_COMMAND}}"
    else
      trap - HUP INT
      PROMPT_COMMAND="history -a${{PROMPT_COMMAND:+; $PROMPT_COMMAND}}"
    fi
  fi
  ;;
esac
"""

# Run as root: the recorder and the snippet in /etc, the snippet read by login shells
# (profile.d) and interactive bash.
_PLACE = (
    f'printf "%s" "$1" > {SNIPPET_PATH} && chmod 644 {SNIPPET_PATH} '
    f'&& printf "%s" "$2" > {RECORDER_PATH} && chmod 644 {RECORDER_PATH} '
    f'&& printf ". {SNIPPET_PATH}\\n" > /etc/profile.d/zz-baseline-record.sh '
    "&& (grep -qs baseline-record /etc/bash.bashrc "
    f'|| printf "\\n[ -r {SNIPPET_PATH} ] && . {SNIPPET_PATH}\\n" >> /etc/bash.bashrc)'
)
# Run as root: start the recorder unless it answers (a socket left by a stopped container's
# recorder removed first), and wait until it answers (5 s at most); nothing in a container placed
# before the recorder existed.
_START = (
    f"[ -f {RECORDER_PATH} ] || exit 0; "
    f"alive() {{ python3 {RECORDER_PATH} ping; }}; alive && exit 0; rm -f {SOCKET_PATH}; "
    f"(nohup setsid python3 {RECORDER_PATH} serve </dev/null >/dev/null 2>&1 &); "
    "i=0; while ! alive && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; "
    "alive || { echo 'the terminal recorder did not start'; exit 1; }"
)


def consent_text(participant: Participant) -> str:
    return participant.study.consent_text or DEFAULT_CONSENT_TEXT


def consent_sha256(participant: Participant) -> str:
    return hashlib.sha256(consent_text(participant).encode()).hexdigest()


def has_consented(participant: Participant) -> bool:
    """Accepted, and accepted this text: a changed consent text is asked for again."""
    return (
        participant.consent_accepted_at is not None
        and participant.consent_sha256 == consent_sha256(participant)
    )


def require_consent(participant: Participant) -> None:
    if participant.kind is ParticipantKind.HUMAN and not has_consented(participant):
        raise Conflict(
            "accept the study's consent text (terminal sessions and shell history are recorded) "
            "before opening your workspace"
        )


def accept_consent(session: Session, participant: Participant, actor_id: int | None) -> None:
    participant.consent_accepted_at = utcnow()
    participant.consent_sha256 = consent_sha256(participant)
    audit.record(
        session, "consent.accept", "participant", participant.id, actor_id,
        sha256=participant.consent_sha256,
    )  # fmt: skip
    session.flush()


def place_in_workspace(
    workspace: Workspace, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> bool:
    """Install the recording wrapper and the recorder in a new attempt container, and start the
    recorder; True when placed."""
    if workspace.purpose is not WorkspacePurpose.ATTEMPT or backend.name != "docker":
        return False
    recorder = Path(terminal_recorder.__file__).read_text()
    done = backend.exec(handle, ["sh", "-c", _PLACE, "place", RECORD_SNIPPET, recorder],
                        timeout_s=60, user="root")  # fmt: skip
    if done.exit_code != 0:
        output = done.output.decode("utf-8", errors="replace").strip()[-300:]
        raise WorkspaceError(f"could not set up terminal recording: {output}")
    start_recorder(backend, handle)
    return True


def start_recorder(backend: WorkspaceBackend, handle: WorkspaceHandle) -> None:
    """Start the root recorder in the container unless it runs (a restarted container has lost
    it; its files are still there). Raises WorkspaceError when it does not come up."""
    done = backend.exec(handle, ["sh", "-c", _START], timeout_s=30, user="root")
    if done.exit_code != 0:
        output = done.output.decode("utf-8", errors="replace").strip()[-300:]
        raise WorkspaceError(f"could not start the terminal recorder: {output}")


@dataclass(frozen=True)
class Collected:
    path: str
    kind: str
    content: bytes
    size: int


_LIST = (
    f"ls -1 {RECORD_DIR}/*.typescript {FALLBACK_RECORD_DIR}/*.typescript 2>/dev/null "
    f"| head -n {MAX_FILES}; "
    f"[ -f {HISTORY_FILE} ] && echo {HISTORY_FILE}; "
    f"[ -f {GAPS_FILE} ] && echo {GAPS_FILE}; "
    f"[ -f {FALLBACK_HISTORY_FILE} ] && echo {FALLBACK_HISTORY_FILE}; "
    "[ -f /home/participant/.bash_history ] && echo /home/participant/.bash_history; true"
)


def read_from(backend: WorkspaceBackend, handle: WorkspaceHandle) -> list[Collected]:
    """The recordings and history files now in the workspace (each cut to its last
    MAX_FILE_BYTES). Raises WorkspaceError when the workspace cannot be read."""
    listed = backend.exec(handle, ["sh", "-c", _LIST], timeout_s=30, user="participant")
    paths = [p for p in listed.output.decode(errors="replace").splitlines() if p.startswith("/")]
    found = []
    for path in paths:
        # The size first and then that many bytes, so that a file still growing (the recorder
        # writes as the participant types) is read as it was at one size, never as a tail longer
        # than the size, which would read as rewritten at the next collection.
        quoted = shlex.quote(path)
        script = f"s=$(wc -c < {quoted}); echo $s; head -c $s {quoted} | tail -c {MAX_FILE_BYTES}"
        result = backend.exec(handle, ["sh", "-c", script], timeout_s=60, user="participant")
        if result.exit_code != 0:
            continue  # gone meanwhile
        head, _, body = result.output.partition(b"\n")
        try:
            size = int(head.strip())
        except ValueError:
            continue
        if path == GAPS_FILE:
            kind = "gaps"
        else:
            kind = "session" if path.rsplit("/", 1)[0] in SESSION_DIRS else "history"
        found.append(Collected(path, kind, body, size))
    return found


# Added to the path of a stored record whose file was later found shortened or rewritten: the
# row keeps what was collected before, beside the row of the file as it is now.
TAMPERED_MARK = " (as collected before it was shortened or rewritten at "


def _continues(row: TerminalRecording, item: Collected) -> bool:
    """True when a file as collected now extends the stored collection of it, as a recording
    does (`script` and `history -a` only append): not shorter, and the stored bytes still where
    they were (compared where the two kept tails overlap)."""
    if item.size < row.size:
        return False
    old_start = row.size - len(row.content)
    new_start = item.size - len(item.content)
    if new_start <= old_start:
        offset = old_start - new_start
        return item.content[offset : offset + len(row.content)] == row.content
    offset = new_start - old_start
    return offset >= len(row.content) or item.content[: len(row.content) - offset] == bytes(
        row.content[offset:]
    )


def store(session: Session, attempt_id: int, collected: Sequence[Collected]) -> int:
    """Keep what was collected with the attempt (one row per file, replaced by a later
    collection that extends it). The participant can write their records' files, so a file
    found shortened or rewritten loses nothing already kept: the stored row is renamed
    (`TAMPERED_MARK`) and kept, the file as it is now gets a row of its own, and the audit log
    records ``terminal.tampered``. Each new line of the recorder's gaps file (a recording that
    ended while its shell ran) is audited ``terminal.interrupted``. Returns how many files were
    stored."""
    at = utcnow()
    existing = {
        row.path: row
        for row in session.scalars(
            select(TerminalRecording).where(TerminalRecording.attempt_id == attempt_id)
        )
    }
    for item in collected:
        row = existing.get(item.path)
        if item.kind == "gaps":
            known = set(_gap_lines(bytes(row.content))) if row is not None else set()
            for line in _gap_lines(item.content):
                if line not in known:
                    gap = _parse_gap(line)
                    audit.record(
                        session, "terminal.interrupted", "attempt", attempt_id, None,
                        **(gap.model_dump() if gap else {"line": line}),
                    )  # fmt: skip
        if row is not None and not _continues(row, item):
            audit.record(
                session, "terminal.tampered", "attempt", attempt_id, None,
                path=item.path, stored_bytes=row.size, found_bytes=item.size,
            )  # fmt: skip
            row.path = f"{item.path}{TAMPERED_MARK}{at.isoformat(timespec='seconds')})"
            session.flush()
            row = None
        if row is None:
            row = TerminalRecording(attempt_id=attempt_id, path=item.path, kind=item.kind)
            session.add(row)
        row.content = item.content
        row.size = item.size
        row.truncated = item.size > len(item.content)
        row.collected_at = at
    session.flush()
    return len(collected)


class Gap(BaseModel):
    """A line of the recorder's GAPS_FILE: a recording (`file`, of `kind` session or history)
    whose connection ended at `at` while the shell it recorded (`shell_pid`) still ran."""

    at: str
    kind: str
    file: str
    sender_pid: int
    shell_pid: int


def _gap_lines(content: bytes) -> list[str]:
    return [line for line in content.decode("utf-8", errors="replace").splitlines() if line]


def _parse_gap(line: str) -> Gap | None:
    try:
        return Gap.model_validate(json.loads(line))
    except (ValueError, ValidationError):
        return None


@dataclass(frozen=True)
class Interruption:
    """A gap as shown to coordinators: parsed, or the line as the recorder wrote it when it
    cannot be read (a line cut at the start of a file kept by its tail)."""

    gap: Gap | None
    line: str


def interruptions(rows: Sequence[TerminalRecording]) -> list[Interruption]:
    """The recordings that ended while their shell still ran, from the stored gaps file."""
    return [
        Interruption(_parse_gap(line), line)
        for row in rows
        if row.kind == "gaps"
        for line in _gap_lines(bytes(row.content))
    ]


def tampered(rows: Sequence[TerminalRecording]) -> list[TerminalRecording]:
    """The stored records whose file was found shortened or rewritten after they were kept."""
    return [row for row in rows if TAMPERED_MARK in row.path]


def collect(
    session: Session,
    attempt_id: int,
    backend_factory: BackendFactory,
    actor_id: int | None = None,
) -> int:
    """Collect from the attempt's running workspace now; Conflict when there is none."""
    workspace = session.scalar(
        select(Workspace).where(
            Workspace.attempt_id == attempt_id,
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status == WorkspaceStatus.RUNNING,
        )
    )
    host = session.get(Host, workspace.host_id) if workspace and workspace.host_id else None
    if workspace is None or host is None:
        raise Conflict(f"attempt {attempt_id} has no running workspace to collect from")
    try:
        with open_backend(backend_factory, host) as backend:
            collected = read_from(backend, handle_of(workspace))
    except WorkspaceError as exc:
        raise Conflict(f"could not read the terminal recordings: {exc}") from exc
    count = store(session, attempt_id, collected)
    audit.record(session, "terminal.collect", "attempt", attempt_id, actor_id, files=count)
    return count


def recordings(session: Session, attempt_id: int) -> list[TerminalRecording]:
    return list(
        session.scalars(
            select(TerminalRecording)
            .where(TerminalRecording.attempt_id == attempt_id)
            .order_by(TerminalRecording.kind.desc(), TerminalRecording.path)
        )
    )


_ESCAPES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>]"
)


def printable(content: bytes) -> str:
    """A typescript as text for reading: ANSI/OSC escape sequences and carriage returns dropped."""
    text = _ESCAPES.sub(b"", content).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return text.decode("utf-8", errors="replace")
