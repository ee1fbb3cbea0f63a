"""API agents and the workspace's `task` command: /attempts/<id>/workspace/..., by attempt token.

These routes take a per-attempt token (`baseline.workspaces.attempt_tokens`), not a user's API
token: an agent running anywhere works in its attempt's workspace (run a command, read, write and
list files), reads its clock and submits; `task` inside the workspace calls the same routes through
the portal relay. A user's token here is 403, an unknown or revoked token 401, another attempt's
token 403, an ended attempt's token 409. Coordinators issue an agent token with POST
.../agent-token. The work itself is `baseline.runs.workspace_api` (audited; transcribed for API
agents).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Float, Integer, List, Nested, String
from apiflask.validators import Length, OneOf, Range
from flask import g, request

from app.access import STAFF, current_user, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, context, user
from baseline.errors import Forbidden, InvalidInput
from baseline.models import Attempt
from baseline.people import visibility
from baseline.runs import workspace_api
from baseline.workspaces import attempt_tokens

F = TypeVar("F", bound=Callable[..., Any])
TOKEN_ERRORS = [*AUTH_ERRORS, 404, 409, 422]
PATH = Length(1, 4096)


def attempt_token(view: F) -> F:
    """Admit the bearer of a token of this attempt only (no user role is admitted: the access
    matrix expects 401 without credentials and 403 with a user's token)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        header = request.headers.get("Authorization", "")
        secret = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if current_user() is not None:
            raise Forbidden("these routes take the attempt's token, not a user's API token")
        if not secret:
            raise attempt_tokens.TokenRefused("an attempt token is required (Bearer bat_...)")
        caller = attempt_tokens.authenticate(g.db, secret, kwargs["attempt_id"])
        commit()  # last_used_at
        g.calls = workspace_api.WorkspaceCalls(context(), caller.attempt_id, caller.token_id)
        return view(*args, **kwargs)

    wrapper.allowed_roles = frozenset()  # type: ignore[attr-defined]
    return cast(F, wrapper)


def calls() -> workspace_api.WorkspaceCalls:
    found: workspace_api.WorkspaceCalls = g.calls
    return found


def _path(value: str) -> str:
    if not value.startswith("/") or "\x00" in value:
        raise InvalidInput("a path must be absolute (e.g. /home/submission/main.py)")
    return value


# -- schemas --


class TokenOut(Schema):
    attempt_id = Integer(required=True)
    token = String(required=True)


class PauseOut(Schema):
    reason = String(required=True)
    started_at = DateTime(required=True)
    ended_at = DateTime(allow_none=True)
    note = String(required=True)


class TaskStatusOut(Schema):
    attempt_id = Integer(required=True)
    status = String(required=True)
    working_s = Float(required=True)
    limit_s = Float(required=True)
    remaining_s = Float(required=True)
    paused = Boolean(required=True)
    pause_reason = String(allow_none=True)
    next_checkpoint_working_s = Float(allow_none=True)
    pauses = List(Nested(PauseOut), required=True)
    can_pause = Boolean(required=True)
    can_score = Boolean(required=True)


class ExecIn(Schema):
    command = String(required=True, validate=Length(1, 100_000))
    timeout_s = Float(load_default=600.0, validate=Range(min=1, max=workspace_api.MAX_TIMEOUT_S))


class ExecOut(Schema):
    exit_code = Integer(allow_none=True, required=True)
    output = String(required=True)
    timed_out = Boolean(required=True)
    truncated = Boolean(required=True)
    duration_s = Float(required=True)


class PathQuery(Schema):
    path = String(required=True, validate=PATH)


class ListQuery(Schema):
    path = String(load_default="/home/submission", validate=PATH)


class FileOut(Schema):
    path = String(required=True)
    encoding = String(required=True)  # utf-8, or base64 when the file is not UTF-8 text
    content = String(required=True)
    size = Integer(required=True)
    truncated = Boolean(required=True)


class FileIn(Schema):
    path = String(required=True, validate=PATH)
    content = String(required=True, validate=Length(0, 4 * workspace_api.MAX_WRITE_BYTES))
    encoding = String(load_default="utf-8", validate=OneOf(["utf-8", "base64"]))
    append = Boolean(load_default=False)


class WrittenOut(Schema):
    path = String(required=True)
    bytes = Integer(required=True)


class EntryOut(Schema):
    name = String(required=True)
    type = String(required=True)
    size = Integer(required=True)


class ListOut(Schema):
    path = String(required=True)
    entries = List(Nested(EntryOut), required=True)


class NoteIn(Schema):
    text = String(required=True, validate=Length(1, 2000))


class OwnPauseIn(Schema):
    note = String(load_default="", validate=Length(0, 500))


class MessageOut(Schema):
    message = String(required=True)


class ScoreOut(Schema):
    score = Float(allow_none=True, required=True)
    raw_score = Float(allow_none=True, required=True)
    error = String(allow_none=True, required=True)
    working_s = Float(required=True)


class SubmitOut(Schema):
    message = String(required=True)
    snapshot_id = Integer(required=True)
    file_count = Integer(required=True)


# -- staff: hand out a token --


@bp.post("/attempts/<int:attempt_id>/agent-token")
@requires(*STAFF)
@bp.output(TokenOut, status_code=201)
@bp.doc(
    summary="Issue an agent token for one live attempt (shown once; revoked when it ends)",
    responses=[*AUTH_ERRORS, 404, 409],
    security=BEARER,
)
def issue_agent_token(attempt_id: int) -> Any:
    attempt: Attempt = visibility.visible_attempt(g.db, user(), attempt_id)
    secret = attempt_tokens.issue(g.db, attempt, attempt_tokens.AGENT, user().id)
    commit()
    return {"attempt_id": attempt_id, "token": secret}


# -- the token's routes --


def _doc(summary: str) -> Callable[[F], F]:
    return cast(Callable[[F], F], bp.doc(summary=summary, responses=TOKEN_ERRORS, security=BEARER))


@bp.get("/attempts/<int:attempt_id>/workspace/task")
@attempt_token
@bp.output(TaskStatusOut)
@_doc("The attempt's clock: working time used and left, next checkpoint, pauses")
def task_status(attempt_id: int) -> Any:
    return calls().status()


@bp.post("/attempts/<int:attempt_id>/workspace/exec")
@attempt_token
@bp.input(ExecIn, arg_name="body")
@bp.output(ExecOut)
@_doc("Run a bash command in the workspace (as the workspace user, in /home/submission)")
def workspace_exec(attempt_id: int, body: dict[str, Any]) -> Any:
    return calls().exec(body["command"], body["timeout_s"])


@bp.get("/attempts/<int:attempt_id>/workspace/file")
@attempt_token
@bp.input(PathQuery, location="query", arg_name="query")
@bp.output(FileOut)
@_doc("Read a file of the workspace")
def read_file(attempt_id: int, query: dict[str, Any]) -> Any:
    path = _path(query["path"])
    data, truncated = calls().read_file(path)
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode(), "base64"
    return {"path": path, "encoding": encoding, "content": content, "size": len(data),
            "truncated": truncated}  # fmt: skip


@bp.put("/attempts/<int:attempt_id>/workspace/file")
@attempt_token
@bp.input(FileIn, arg_name="body")
@bp.output(WrittenOut)
@_doc("Write (or append to) a file of the workspace, as the workspace user")
def write_file(attempt_id: int, body: dict[str, Any]) -> Any:
    path = _path(body["path"])
    if body["encoding"] == "base64":
        try:
            data = base64.b64decode(body["content"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidInput(f"content is not base64: {exc}") from exc
    else:
        data = body["content"].encode("utf-8", errors="surrogatepass")
    return {"path": path, "bytes": calls().write_file(path, data, body["append"])}


@bp.get("/attempts/<int:attempt_id>/workspace/list")
@attempt_token
@bp.input(ListQuery, location="query", arg_name="query")
@bp.output(ListOut)
@_doc("List a directory of the workspace")
def list_dir(attempt_id: int, query: dict[str, Any]) -> Any:
    path = _path(query["path"])
    return {"path": path, "entries": calls().list_dir(path)}


@bp.post("/attempts/<int:attempt_id>/workspace/pause")
@attempt_token
@bp.input(OwnPauseIn, arg_name="body")
@bp.output(MessageOut)
@_doc("Pause the working clock (human participants)")
def task_pause(attempt_id: int, body: dict[str, Any]) -> Any:
    calls().pause(body["note"])
    return {"message": "clock paused"}


@bp.post("/attempts/<int:attempt_id>/workspace/resume")
@attempt_token
@bp.output(MessageOut)
@_doc("Resume the working clock after the participant's own pause (human participants)")
def task_resume(attempt_id: int) -> Any:
    calls().resume()
    return {"message": "clock resumed"}


@bp.post("/attempts/<int:attempt_id>/workspace/note")
@attempt_token
@bp.input(NoteIn, arg_name="body")
@bp.output(MessageOut)
@_doc("Leave a note in the attempt's record")
def task_note(attempt_id: int, body: dict[str, Any]) -> Any:
    calls().note(body["text"])
    return {"message": "note recorded"}


@bp.post("/attempts/<int:attempt_id>/workspace/score")
@attempt_token
@bp.output(ScoreOut)
@_doc("An intermediate score of the submission as it is now (scored tasks)")
def task_score(attempt_id: int) -> Any:
    return calls().score()


@bp.post("/attempts/<int:attempt_id>/workspace/submit")
@attempt_token
@bp.output(SubmitOut)
@_doc("Submit: take the final snapshot and end the attempt (final)")
def task_submit(attempt_id: int) -> Any:
    snapshot_id, file_count = calls().submit()
    return {"message": f"submitted; final snapshot {snapshot_id}", "snapshot_id": snapshot_id,
            "file_count": file_count}  # fmt: skip
