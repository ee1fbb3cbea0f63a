"""Running a command agent on an attempt: its program in the workspace, its model through us.

The attempt is an ordinary agent attempt (same workspace, clock, checkpoints, snapshots); what
differs is who drives. `CommandAgent.run`:

1. opens the attempt's `AgentRun` (scaffold ``command``; the command, its version, its
   environment and the model settings recorded as its settings), or resumes it;
2. copies the relay (`agents.workspace_relay`) into a root-owned directory of the workspace and
   starts it as root: its server detached, its reader through a long-running exec, whose output
   stream carries the agent's model requests to `baseline.runs.model_passthrough`; answers go
   back by copy-in. The relay listens on
   the workspace's loopback, so this needs no network, and it uses only the backend's exec and
   copy-in, so it works on ssh:// hosts as on the local one;
3. starts the command detached (its own session) as the workspace user in /home/submission, with
   ``OPENAI_BASE_URL`` the relay and ``OPENAI_API_KEY`` a per-attempt key
   (`baseline.runs.model_keys`); the provider's key stays in this process;
4. watches: checkpoints fall due through `baseline.attempts.schedule` as for every attempt; the
   token and cost limits end the attempt (the passthrough already refuses calls past them); when the
   command exits, the attempt is submitted, as a built-in agent's ``end_task`` does.

A worker restarted mid-run resumes: the command kept running in the workspace (its key is still
valid), and so did the relay's server, so only a new reader of the relay is started: the requests
the dead worker left unanswered reach the new one, and the agent's waiting call gets its answer.
When the workspace was restarted and the command is gone without having exited, it is started
again with a new key and the transcript says so. When the attempt ends, its keys are revoked and
the command and the relay are stopped (with the workspace, which the end of an agent's attempt
stops).
"""

from __future__ import annotations

import base64
import io
import json
import logging
import shlex
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import workspace_relay
from agents.command import SCAFFOLD, CommandSpec, command_from_flat
from agents.settings import AgentSettings
from baseline.attempts import attempts, clock, schedule
from baseline.attempts.snapshots import resolve_source, store_for
from baseline.context import Context
from baseline.errors import Conflict, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    AgentRun,
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.runs import blacklist_monitor, driver_clock, driver_lease, model_keys
from baseline.runs.agent_runs import RunOutcome, enrolled_settings, open_run
from baseline.runs.model_passthrough import Passthrough, ProxyRequest, ProxyResponse, limit_reached
from baseline.runs.transcripts import append_entry
from baseline.workspaces import workspaces
from infra.workspace import (
    LOGS_DIR,
    PARTICIPANT_USER,
    SUBMISSION_DIR,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceState,
)

log = logging.getLogger(__name__)

RELAY_DIR = "/opt/baseline-model"
RELAY_PORT = 19127  # on the workspace's loopback; below the ephemeral range (infra.hub.config)
BASE_URL = f"http://127.0.0.1:{RELAY_PORT}/v1"
SERVE_PID = f"{RELAY_DIR}/serve.pid"
STREAM_PID = f"{RELAY_DIR}/stream.pid"
ANSWERED_KEPT = 512  # request ids a channel remembers having answered
EXIT_FILE = f"{LOGS_DIR}/.agent-exit"
PID_FILE = f"{LOGS_DIR}/.agent-pid"
AGENT_LOG = f"{LOGS_DIR}/agent.log"
RELAY_SOURCE = Path(workspace_relay.__file__)


def spec_for(attempt: Attempt) -> tuple[CommandSpec, AgentSettings]:
    return enrolled_settings(attempt, command_from_flat)


def relay_tar() -> bytes:
    """The relay's directory for /opt: root-owned, its answers directory root-only."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in (
            ("baseline-model", 0o755), ("baseline-model/in", 0o700), ("baseline-model/out", 0o700)
        ):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        data = RELAY_SOURCE.read_bytes()
        info = tarfile.TarInfo("baseline-model/relay.py")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def answer_tar(request_id: str, response: ProxyResponse) -> bytes:
    """The answer, then its `.done` marker: the relay reads the answer once the marker exists."""
    answer = json.dumps({
        "status": response.status,
        "content_type": response.content_type,
        "body": base64.b64encode(response.body).decode(),
    }).encode()  # fmt: skip
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in ((f"{request_id}.json", answer), (f"{request_id}.done", b"")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def launch_script(spec: CommandSpec, key: str) -> str:
    """The shell line that starts the command detached and prints its session id."""
    env = {**spec.command_env, "OPENAI_BASE_URL": BASE_URL, "OPENAI_API_BASE": BASE_URL,
           "OPENAI_API_KEY": key}  # fmt: skip
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    # The session leader writes its own id (setsid may fork, so `$!` is not it); the
    # launcher waits for it, so a watcher never sees a command that is neither running nor done.
    inner = (
        f"echo $$ > {PID_FILE}; cd {SUBMISSION_DIR} && env {assignments} "
        f"sh -c {shlex.quote(spec.command)} >>{AGENT_LOG} 2>&1; echo $? > {EXIT_FILE}"
    )
    return (
        f"rm -f {EXIT_FILE} {PID_FILE}; setsid sh -c {shlex.quote(inner)} </dev/null "
        f">/dev/null 2>&1 & i=0; while [ ! -s {PID_FILE} ] && [ $i -lt 600 ]; do sleep 0.05; "
        f"i=$((i+1)); done; cat {PID_FILE}"
    )


class RelayChannel:
    """The exec stream that carries the relay's requests; answers go back by copy-in.

    Each request is answered, and the model called for it, at most once:

    - across drivers, by `fence` (the driver's lease, `driver_lease.Lease.fence`), confirmed in
      the database before the model call and again before the answer is written, and before a
      reader is started (which stops the current one). A driver that lost the attempt (it
      stalled past its lease while another took over, but lives) leaves the request alone: the
      new driver's reader hands it on as one still waiting, and the new driver answers it. A
      request a dead driver took is answered the same way once its lease has expired;
    - within a driver, by the ids it has taken: a restarted reader hands on again every request
      still waiting, the ones this driver is answering included.
    """

    def __init__(
        self, backend: WorkspaceBackend, handle: WorkspaceHandle,
        answer: Callable[[ProxyRequest], ProxyResponse], threads: int = 8,
        fence: Callable[[], None] = driver_lease.unchecked,
    ) -> None:  # fmt: skip
        self.backend, self.handle, self.answer, self.fence = backend, handle, answer, fence
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=f"relay-{handle.name}")
        self.ready = threading.Event()
        self._buffer = b""
        self._thread: threading.Thread | None = None
        self._reader_pid: int | None = None  # this channel's reader, as its ready line says
        self._taken_lock = threading.Lock()
        self._in_flight: set[str] = set()
        # Answered lately: the relay drops a request within a poll of its answer, so a few
        # hundred cover a reader restarted meanwhile.
        self._answered: deque[str] = deque(maxlen=ANSWERED_KEPT)

    def start(self, wait_s: float = 30.0) -> None:
        """Install the relay and start its server unless it runs, then this channel's reader
        (replacing an earlier reader, whose unanswered requests it hands on); back once the
        server listens. The server is left running: the agent's requests in flight when a
        worker dies are answered by the next one. Raises `DriverLost` (before touching the
        workspace) when this driver no longer holds the attempt: its reader would stop the new
        driver's."""
        self.fence()
        self.ready.clear()
        self._buffer = b""
        self.backend.put_archive(self.handle, "/opt", relay_tar())
        relay, serve_pid, stream_pid = f"{RELAY_DIR}/relay.py", SERVE_PID, STREAM_PID
        script = (
            f"if ! {{ [ -f {serve_pid} ] && kill -0 $(cat {serve_pid}) 2>/dev/null; }}; then "
            f"setsid python3 -u {relay} serve {RELAY_DIR} {RELAY_PORT} </dev/null "
            f">>{RELAY_DIR}/serve.log 2>&1 & echo $! > {serve_pid}; fi; "
            f"[ -f {stream_pid} ] && kill $(cat {stream_pid}) 2>/dev/null; "
            f"echo $$ > {stream_pid}; "
            f"exec python3 -u {relay} stream {RELAY_DIR} {RELAY_PORT}"
        )
        self._thread = threading.Thread(
            target=self._stream, args=(script,),
            name=f"relay-stream-{self.handle.name}", daemon=True,
        )  # fmt: skip
        self._thread.start()
        if not self.ready.wait(wait_s):
            raise Conflict(f"the model relay in {self.handle.name} did not start")

    def _stream(self, script: str) -> None:
        """Run the relay, feeding its output to `_feed` until it ends."""
        try:
            self.backend.exec(
                self.handle, ["sh", "-c", script],
                user="root", on_output=self._feed, max_output_bytes=4096,
            )  # fmt: skip
        except Exception:  # cut: a newer reader replaced it, or the workspace went away (the
            # engine's connection may end either way); the watcher notices it
            log.warning("relay stream of %s ended", self.handle.name, exc_info=True)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if not line.startswith(workspace_relay.MARK):
                if line.strip():
                    log.warning("relay in %s: %s", self.handle.name, line[:500])
                continue
            try:
                frame = json.loads(line[len(workspace_relay.MARK) :])
            except json.JSONDecodeError:
                log.warning("relay in %s: not a frame: %s", self.handle.name, line[:500])
                continue
            if "ready" in frame:
                self._reader_pid = int(frame["pid"])
                self.ready.set()
            elif self._take(str(frame["id"])):
                self.pool.submit(self._serve, frame)

    def _take(self, request_id: str) -> bool:
        """True unless this channel is answering the request or has answered it."""
        with self._taken_lock:
            if request_id in self._in_flight or request_id in self._answered:
                return False
            self._in_flight.add(request_id)
            return True

    def _settle(self, request_id: str, answered: bool) -> None:
        with self._taken_lock:
            self._in_flight.discard(request_id)
            if answered:
                self._answered.append(request_id)

    def _serve(self, frame: dict[str, Any]) -> None:
        request_id = str(frame["id"])
        request = ProxyRequest(
            method=str(frame["method"]), path=str(frame["path"]),
            headers={str(k).lower(): str(v) for k, v in frame["headers"].items()},
            body=base64.b64decode(frame["body"]),
        )  # fmt: skip
        try:
            self.fence()  # no model call for a driver that lost the attempt
            response = self.answer(request)
            self.fence()  # nor an answer: the new driver gives it
        except driver_lease.DriverLost as exc:
            log.warning("request %s of %s left to the attempt's new driver: %s", request_id,
                        self.handle.name, exc)  # fmt: skip
            self._settle(request_id, answered=False)
            return
        except Exception:
            log.exception("passthrough of %s failed", self.handle.name)
            response = ProxyResponse(
                500, b'{"error": {"message": "passthrough failed", "type": "server_error"}}'
            )
        try:
            self.backend.put_archive(
                self.handle, f"{RELAY_DIR}/out", answer_tar(request_id, response)
            )
        except WorkspaceError:  # the workspace went away; the watcher notices it
            log.warning("answer to %s not delivered", self.handle.name, exc_info=True)
        self._settle(request_id, answered=True)

    def stop(self, server: bool = True) -> None:
        """Stop this channel's reader (unless another driver's replaced it: the pid file names
        that one), and with `server` the relay's server (the run ended); without it the server
        keeps the agent's waiting requests for the next driver."""
        mine = self._reader_pid
        kills = [f'[ "$(cat {STREAM_PID})" = "{mine}" ] && kill {mine}'] if mine else []
        if server:
            kills.append(f"kill $(cat {SERVE_PID})")
        self.pool.shutdown(wait=False, cancel_futures=True)
        if kills:
            self.backend.exec(self.handle, ["sh", "-c", "; ".join(kills)], user="root",
                              timeout_s=30)  # fmt: skip


@dataclass
class CommandAgent:
    """Drives one command agent attempt until its command exits or the attempt ends."""

    ctx: Context
    attempt_id: int
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = 2.0
    environ: dict[str, str] | None = None
    # As `AgentLoop`'s, but confirmed in the database (`driver_lease.Lease.fence`): the relay
    # calls it before every model call, and the watcher before every round.
    still_driving: Callable[[], None] = driver_lease.unchecked

    def __post_init__(self) -> None:
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            self.spec, self.settings = spec_for(attempt)
        self.store = store_for(self.ctx)

    def _attempt(self, session: Session) -> Attempt:
        attempt = session.get(Attempt, self.attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {self.attempt_id}")
        return attempt

    def _open_run(self) -> tuple[int, bool]:
        recorded = {**self.spec.model_dump(mode="json"), **self.settings.model_dump(mode="json")}
        with self.ctx.session() as session:
            run, resumed = open_run(
                session, self._attempt(session), SCAFFOLD, self.settings.model.model, recorded
            )
            return run.id, resumed

    def _notice(self, run_id: int, text: str, **values: Any) -> None:
        now = utcnow()
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            append_entry(session, run_id, kind="notice", content=text,
                         started_at=now, ended_at=now,
                         working_s=clock.state(attempt, now).working_s, **values)  # fmt: skip

    def _workspace(self) -> tuple[WorkspaceBackend, WorkspaceHandle]:
        with self.ctx.session() as session:
            workspace = session.scalar(
                select(Workspace)
                .where(
                    Workspace.attempt_id == self.attempt_id,
                    Workspace.purpose == WorkspacePurpose.ATTEMPT,
                    Workspace.status != WorkspaceStatus.DESTROYED,
                )
                .order_by(Workspace.id.desc())
            )
            if workspace is None or workspace.host_id is None:
                raise Conflict(f"attempt {self.attempt_id} has no live workspace")
            host = session.get(Host, workspace.host_id)
            assert host is not None
            return self.backend_factory(host), workspaces.handle_of(workspace)

    def _sh(self, backend: WorkspaceBackend, handle: WorkspaceHandle, script: str,
            user: str = "root") -> tuple[int | None, str]:  # fmt: skip
        result = backend.exec(handle, ["sh", "-c", script], user=user, timeout_s=60)
        return result.exit_code, result.output.decode("utf-8", errors="replace").strip()

    def _command_state(
        self, backend: WorkspaceBackend, handle: WorkspaceHandle
    ) -> tuple[str, int | None]:
        """("exited", code), ("running", None) or ("absent", None)."""
        # As the command's own user: the workspace's root has no CAP_KILL, so it cannot even
        # probe another user's process.
        _, out = self._sh(backend, handle,
                          f"if [ -s {EXIT_FILE} ]; then echo exited $(cat {EXIT_FILE}); "
                          f"elif [ -f {PID_FILE} ] && kill -0 $(cat {PID_FILE}) 2>/dev/null; "
                          f"then echo running; elif [ -f {EXIT_FILE} ]; then echo running; "
                          "else echo absent; fi", PARTICIPANT_USER)  # fmt: skip
        words = out.split()
        if words and words[0] == "exited":
            code = int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else None
            return "exited", code
        return (words[0] if words else "absent"), None

    def _start_command(self, run_id: int, backend: WorkspaceBackend,
                       handle: WorkspaceHandle) -> None:  # fmt: skip
        with self.ctx.session() as session:
            key = model_keys.issue(session, self.attempt_id)
        code, out = self._sh(backend, handle, launch_script(self.spec, key), PARTICIPANT_USER)
        if code != 0:
            raise Conflict(f"the agent's command did not start: {out[-500:]}")
        session_id = out.split()[-1] if out else "?"
        version = self.spec.command_version
        self._notice(run_id, f"started: {self.spec.command} (version {version}; "
                             f"session {session_id})")  # fmt: skip

    def _live(self) -> bool:
        with self.ctx.session() as session:
            return self._attempt(session).status in LIVE_ATTEMPT_STATUSES

    def run(self) -> RunOutcome:
        run_id, resumed = self._open_run()
        driver_clock.driving_starts(self.ctx, self.attempt_id)
        backend, handle = self._workspace()
        if not self._live():  # a resumed run whose attempt ended meanwhile: its workspace stopped
            with self.ctx.session() as session:
                run = session.get(AgentRun, run_id)
                status = self._attempt(session).status
                assert run is not None
                steps = run.steps
            return self._end(run_id, backend, handle, f"attempt {status.value}", steps)
        passthrough = Passthrough(self.ctx, self.attempt_id, run_id, self.settings, self.store)
        if self.environ is not None:
            passthrough.environ = self.environ
        channel = RelayChannel(backend, handle, passthrough.handle, fence=self.still_driving)
        ended = True  # the relay's server stops with this driver unless the run goes on
        try:
            channel.start()
            state, _ = self._command_state(backend, handle) if resumed else ("absent", None)
            if resumed:
                self._notice(run_id, f"resumed after a worker restart; the command is {state}")
            if state == "absent":
                if resumed:
                    self._notice(run_id, "the command was gone (workspace restarted): started "
                                         "again with a new model key")  # fmt: skip
                self._start_command(run_id, backend, handle)
            return self._watch(run_id, backend, handle, channel)
        except driver_lease.DriverLost:
            ended = False
            raise  # the run goes on under its new driver: neither failed nor ended here
        except Exception as exc:
            self._finish_run(run_id, AgentRunStatus.FAILED, f"{type(exc).__name__}: {exc}")
            attempts.agent_run_failed(self.ctx, self.attempt_id, self.backend_factory)
            raise
        finally:
            try:
                channel.stop(server=ended)
            except Exception:  # the workspace may be gone; nothing left to stop then
                log.info("relay of attempt %s not stopped", self.attempt_id, exc_info=True)
            close = getattr(backend, "close", None)
            if callable(close):
                close()

    def _watch(self, run_id: int, backend: WorkspaceBackend, handle: WorkspaceHandle,
               channel: RelayChannel) -> RunOutcome:  # fmt: skip
        while True:
            self.still_driving()
            blacklist_monitor.watch(self.ctx, self.attempt_id)  # its calls' transcript, egress
            schedule.run_due(self.ctx, self.attempt_id, resolve_source,
                             backend_factory=self.backend_factory)  # fmt: skip
            with self.ctx.session() as session:
                attempt = self._attempt(session)
                run = session.get(AgentRun, run_id)
                assert run is not None
                status, steps = attempt.status, run.steps
                limit = limit_reached(self.settings, run)
            if status not in LIVE_ATTEMPT_STATUSES:
                return self._end(run_id, backend, handle, f"attempt {status.value}", steps)
            if limit is not None:
                with self.ctx.session() as session:
                    source = resolve_source(session, self._attempt(session))
                schedule.finish(self.ctx, self.attempt_id, AttemptStatus.ENDED, limit, None,
                                source, None, backend_factory=self.backend_factory)  # fmt: skip
                return self._end(run_id, backend, handle, limit, steps)
            try:
                state, code = self._command_state(backend, handle)
                if state == "exited":
                    self._notice(run_id, f"the command exited with {code}", exit_code=code)
                    attempts.submit(self.ctx, self.attempt_id, None, resolve_source,
                                    backend_factory=self.backend_factory)  # fmt: skip
                    return self._end(run_id, backend, handle, f"the command exited ({code})",
                                     steps)  # fmt: skip
                if state == "absent":  # the workspace was restarted under it
                    self._notice(run_id, "the command was gone without an exit status "
                                         "(workspace restarted): started again with a new "
                                         "model key")  # fmt: skip
                    self._start_command(run_id, backend, handle)
                if not channel.alive():
                    channel.start()
            except (WorkspaceError, Conflict):
                if self._live():
                    raise
                continue  # the scheduler ended the attempt and stopped its workspace meanwhile
            self.sleep(self.poll_s)

    def _end(self, run_id: int, backend: WorkspaceBackend, handle: WorkspaceHandle,
             reason: str, steps: int) -> RunOutcome:  # fmt: skip
        with self.ctx.session() as session:
            model_keys.revoke_all(session, self.attempt_id)
        try:
            if backend.status(handle) is WorkspaceState.RUNNING:  # not stopped with the attempt
                self._sh(backend, handle,
                         f"[ -f {PID_FILE} ] && kill -TERM -$(cat {PID_FILE}); true",
                         PARTICIPANT_USER)  # fmt: skip
        except Exception:
            log.info("command of attempt %s not stopped", self.attempt_id, exc_info=True)
        self._finish_run(run_id, AgentRunStatus.FINISHED, reason)
        return RunOutcome(run_id, AgentRunStatus.FINISHED, reason, steps)

    def _finish_run(self, run_id: int, status: AgentRunStatus, reason: str) -> None:
        with self.ctx.session() as session:
            run = session.get(AgentRun, run_id)
            assert run is not None
            run.status, run.end_reason, run.ended_at = status, reason[:2000], utcnow()
