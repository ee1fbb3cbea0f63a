"""The model passthrough of a command agent's attempt: an OpenAI-compatible endpoint that holds
the provider's key, so the agent in the workspace never does.

A command agent (`agents.command`) calls ``OPENAI_BASE_URL`` with its per-attempt key
(`baseline.runs.model_keys`). Each request reaches `Passthrough.handle` (through the relay in the
workspace, `baseline.runs.command_agents`), which:

- refuses a key that is not one of *this* attempt's live keys (401 ``invalid_api_key``), and an
  attempt that is no longer live (403);
- refuses a request once the attempt's token or cost limit is reached (429
  ``insufficient_quota``, OpenAI's own code for a spent budget, so agents stop rather than retry);
- pins the enrolled model (the request's ``model`` is replaced), so prices and results belong to
  the configuration that was enrolled, and asks a streaming answer for its usage;
- forwards it to the enrolled endpoint with the provider's key (read from the worker's
  environment, variable ``api_key_env``), and logs the call exactly as a built-in agent's: a
  `ModelCall` ledger row, the run's token and cost totals, and a transcript entry (the whole
  request and answer kept as a blob);
- treats the provider's outages as a built-in agent's loop does: a call answered 429 or 5xx (or
  not at all) opens a ``rate_limit`` pause at its start, and the next call that succeeds ends it
  at its own start, so the agent is not charged for the provider's outage (the agent's own
  retries decide when that is; the wall-clock cap still bounds the attempt).

Only the model API paths are passed: ``chat/completions``, ``completions``, ``responses`` and
``embeddings`` (POST) and ``models`` (GET).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agents.settings import AgentSettings
from baseline.attempts import attempts, clock
from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import LIVE_ATTEMPT_STATUSES, AgentRun, Attempt, ModelCall, PauseReason, utcnow
from baseline.runs import model_keys
from baseline.runs.transcripts import append_entry
from infra.blobs import BlobStore

log = logging.getLogger(__name__)

POST_PATHS = frozenset({"chat/completions", "completions", "responses", "embeddings"})
GET_PATHS = frozenset({"models"})
SHOWN_CHARS = 16_000  # of an answer's text in the transcript entry (the blob keeps it all)


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    path: str  # as the agent sent it, e.g. /v1/chat/completions
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True)
class ProxyResponse:
    status: int
    body: bytes
    content_type: str = "application/json"


def error(status: int, message: str, kind: str, code: str) -> ProxyResponse:
    """An error in OpenAI's shape, which agents' SDKs parse and show."""
    payload = {"error": {"message": message, "type": kind, "code": code, "param": None}}
    return ProxyResponse(status, json.dumps(payload).encode())


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _usage_of(data: dict[str, Any]) -> Usage | None:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    output = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return Usage(int(prompt or 0), int(output or 0))


def parse_answer(body: bytes, content_type: str) -> tuple[Usage, str | None, list[Any] | None]:
    """Usage, text and tool calls of an answer, plain JSON or server-sent events."""
    if "text/event-stream" in content_type:
        usage, parts = Usage(), []
        for line in body.decode("utf-8", errors="replace").splitlines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            try:
                event = json.loads(line[5:])
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                usage = _usage_of(event) or usage
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    parts.append(str(delta.get("content") or ""))
        return usage, "".join(parts) or None, None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return Usage(), None, None
    if not isinstance(data, dict):
        return Usage(), None, None
    usage = _usage_of(data) or Usage()
    choices = data.get("choices") or []
    if choices and isinstance(choices[0], dict):
        message = choices[0].get("message") or {}
        return usage, message.get("content"), message.get("tool_calls")
    return usage, None, None


@dataclass
class Passthrough:
    """One attempt's passthrough; thread-safe (an agent may call in parallel)."""

    ctx: Context
    attempt_id: int
    run_id: int
    settings: AgentSettings
    store: BlobStore
    # (method, url, body or None, headers, timeout) -> (status, content type, body)
    send: Callable[[str, str, bytes | None, dict[str, str], float], tuple[int, str, bytes]] = field(
        default=lambda *args: forward(*args)
    )
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def __post_init__(self) -> None:
        self._log_lock = threading.Lock()
        self._pause_lock = threading.Lock()

    # -- checks --

    def _refusal(self, request: ProxyRequest) -> ProxyResponse | None:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        key = key or request.headers.get("api-key", "")
        with self.ctx.session() as session:
            if model_keys.attempt_of(session, key) != self.attempt_id:
                return error(
                    401, "Invalid API key for this attempt's model passthrough.",
                    "invalid_request_error", "invalid_api_key",
                )  # fmt: skip
            attempt = session.get(Attempt, self.attempt_id)
            assert attempt is not None
            if attempt.status not in LIVE_ATTEMPT_STATUSES:
                return error(
                    403, f"The attempt is {attempt.status.value}: no more model calls.",
                    "invalid_request_error", "attempt_not_live",
                )  # fmt: skip
            run = session.get(AgentRun, self.run_id)
            assert run is not None
            limit = limit_reached(self.settings, run)
        if limit is not None:
            return error(
                429, f"This attempt's {limit}.", "insufficient_quota", "insufficient_quota"
            )
        return None

    def _route(self, request: ProxyRequest) -> str | None:
        path = request.path.split("?", 1)[0].lstrip("/")
        path = path[3:] if path.startswith("v1/") else path
        allowed = POST_PATHS if request.method == "POST" else GET_PATHS
        if request.method not in ("POST", "GET") or path not in allowed:
            return None
        return path

    # -- forwarding --

    def handle(self, request: ProxyRequest) -> ProxyResponse:
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        path = self._route(request)
        if path is None:
            return error(404, f"{request.method} {request.path} is not a model API route.",
                         "invalid_request_error", "unknown_url")  # fmt: skip
        body = request.body
        if request.method == "POST":
            try:
                payload = json.loads(body or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                return error(400, "The request body is not JSON.", "invalid_request_error",
                             "invalid_json")  # fmt: skip
            if not isinstance(payload, dict):
                return error(400, "The request body must be a JSON object.",
                             "invalid_request_error", "invalid_json")  # fmt: skip
            payload["model"] = self.settings.model.model
            if payload.get("stream") and path == "chat/completions":
                payload["stream_options"] = {**(payload.get("stream_options") or {}),
                                             "include_usage": True}  # fmt: skip
            body = json.dumps(payload).encode()
        key = self.environ.get(self.settings.model.api_key_env) or "not-needed"
        url = self.settings.model.base_url.rstrip("/") + "/" + path
        started = utcnow()
        try:
            status, content_type, content = self.send(
                request.method, url, body if request.method == "POST" else None,
                {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                self.settings.model.timeout_s,
            )  # fmt: skip
        except OSError as exc:
            response = error(502, f"The model provider did not answer: {type(exc).__name__}.",
                             "server_error", "upstream_unreachable")  # fmt: skip
            self._log(path, body, response, started, failed=True)
            self._outage(started, f"model provider unreachable ({type(exc).__name__})")
            return response
        response = ProxyResponse(status, content, content_type)
        if request.method == "POST":
            self._log(path, body, response, started, failed=status >= 400)
            if status == 429 or status >= 500:
                self._outage(started, f"model provider answered {status}")
            elif status < 400:
                self._recovered(started)
        return response

    # -- the provider's outages are not the agent's time (as for built-in agents) --

    def _open_pause(self) -> PauseReason | None:
        with self.ctx.session() as session:
            attempt = session.get(Attempt, self.attempt_id)
            assert attempt is not None
            current = clock.open_pause(attempt)
            return current.reason if current is not None else None

    def _outage(self, at: datetime, note: str) -> None:
        """A failing call opens a rate_limit pause at its start (unless the clock is paused)."""
        with self._pause_lock:
            if self._open_pause() is not None:
                return
            try:
                attempts.pause(self.ctx, self.attempt_id, PauseReason.RATE_LIMIT, None,
                               note=note, now=at)  # fmt: skip
            except Conflict as exc:  # ended meanwhile
                log.info("attempt %s: no rate_limit pause: %s", self.attempt_id, exc)

    def _recovered(self, at: datetime) -> None:
        """The first call that succeeds ends the outage's pause at its own start."""
        with self._pause_lock:
            if self._open_pause() is not PauseReason.RATE_LIMIT:
                return
            try:
                attempts.resume(self.ctx, self.attempt_id, None, now=at)
            except Conflict as exc:
                log.info("attempt %s: rate_limit pause not ended: %s", self.attempt_id, exc)

    # -- logging --

    def _log(
        self, path: str, sent: bytes, response: ProxyResponse, started: datetime, *, failed: bool
    ) -> None:
        ended = utcnow()
        usage, text, tool_calls = (
            (Usage(), None, None) if failed else parse_answer(response.body, response.content_type)
        )
        cost = self.settings.model.cost(usage.prompt_tokens, usage.completion_tokens)
        exchange = json.dumps({
            "path": path,
            "request": sent.decode("utf-8", errors="replace"),
            "status": response.status,
            "response": response.body.decode("utf-8", errors="replace"),
        }).encode()  # fmt: skip
        digest = self.store.put_bytes(exchange)
        with self._log_lock, self.ctx.session() as session:
            attempt = session.get(Attempt, self.attempt_id)
            run = session.get(AgentRun, self.run_id)
            assert attempt is not None and run is not None
            session.add(
                ModelCall(
                    study_id=attempt.study_id, attempt_id=attempt.id, purpose="agent",
                    model=self.settings.model.model, prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens, cost_usd=cost, created_at=ended,
                )
            )  # fmt: skip
            run.prompt_tokens += usage.prompt_tokens
            run.completion_tokens += usage.completion_tokens
            run.cost_usd += cost
            if not failed:
                run.steps += 1
            shown = text if not failed else response.body.decode("utf-8", errors="replace")
            append_entry(
                session, self.run_id,
                kind="model_error" if failed else "model_call",
                role=None if failed else "assistant",
                content=f"{path} → HTTP {response.status}: {shown or ''}"[:SHOWN_CHARS],
                tool_calls=tool_calls, output_sha256=digest, output_bytes=len(exchange),
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens, cost_usd=cost,
                started_at=started, ended_at=ended,
                working_s=clock.state(attempt, ended).working_s,
            )  # fmt: skip


def forward(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout_s: float
) -> tuple[int, str, bytes]:
    """One HTTP exchange with the provider; an error status is an answer, not an exception."""
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def limit_reached(settings: AgentSettings, run: AgentRun) -> str | None:
    """Which limit the run has reached, in words, or None."""
    tokens = run.prompt_tokens + run.completion_tokens
    if settings.token_limit is not None and tokens >= settings.token_limit:
        return f"token limit is reached ({tokens} >= {settings.token_limit} tokens)"
    if settings.cost_limit_usd is not None and run.cost_usd >= settings.cost_limit_usd:
        return f"cost limit is reached (${run.cost_usd:.4f} >= ${settings.cost_limit_usd})"
    return None
