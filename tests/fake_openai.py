"""A local OpenAI-compatible chat-completions server for tests and benchmarks.

Why: the judge must be tested against real HTTP (the openai SDK, its retries switched off, our own
retries, time-outs, structured-output parsing) without ever calling a paid API. The server answers
``POST /v1/chat/completions`` on 127.0.0.1 with a random port, from a scripted ``answer`` callable
that sees the request body, so answers are deterministic functions of the prompt. It counts usage
tokens, takes a fixed latency per answer, and injects faults into a chosen fraction of calls:

- ``"429"``: rate limited (with a ``retry-after-ms`` header of 0, so the SDK would not wait);
- ``"500"``: an internal server error;
- ``"timeout"``: sleeps ``timeout_sleep_s`` before answering, past the client's time-out;
- ``"malformed"``: a 200 whose message content is truncated JSON.

Agents: ``answer`` may return a `Reply` (content and/or tool calls), which becomes an assistant
message with ``tool_calls``; ``fault_plan`` lists faults for the next requests in order (a phase of
429s and 500s, deterministic, taken before the random ``fault_rate``); ``context_tokens`` makes a
prompt longer than that many (fake) tokens a 400 ``context_length_exceeded``, as OpenAI answers.

``tokens_per_minute`` makes it enforce a provider's limit as a real one does: over a sliding
window of ``limit_window_s`` seconds it admits at most that share of the per-minute tokens
(prompt tokens counted on arrival, completion tokens when answered) and answers the rest with a
429 whose ``retry-after-ms`` says when room frees up.

``structured_output=False`` makes it refuse ``response_format`` of type ``json_schema`` with a 400,
as some OpenAI-compatible servers do, so the client's JSON-mode fallback can be tested.
Every request is logged (body, fault injected, answer) for assertions.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("429", "500", "timeout", "malformed")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """An assistant message: text, tool calls, or both."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


Answer = Callable[[dict[str, Any]], "str | dict[str, Any] | Reply"]


@dataclass
class LoggedRequest:
    body: dict[str, Any]
    fault: str | None
    content: str | None
    status: int


class _Server(ThreadingHTTPServer):
    """A deep listen backlog: the judge opens dozens of connections at once, and the default of
    5 makes the kernel refuse some, so calls would fail that never reached this server.
    (It must be a class attribute: the socket listens inside the constructor.)"""

    daemon_threads = True
    request_queue_size = 256


@dataclass
class FakeOpenAI:
    """Use as ``with FakeOpenAI(answer=...) as server:``; point a client at ``server.base_url``."""

    answer: Answer
    latency_s: float = 0.0
    fault_rate: float = 0.0
    fault_kinds: tuple[str, ...] = FAULT_KINDS
    timeout_sleep_s: float = 2.0
    structured_output: bool = True
    seed: int = 0
    fault_plan: list[str] = field(default_factory=list)
    context_tokens: int | None = None
    tokens_per_minute: float | None = None
    limit_window_s: float = 10.0
    requests: list[LoggedRequest] = field(default_factory=list)
    # The Authorization header of every POST, in order (which key reached the provider).
    authorizations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = set(self.fault_kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        self._lock = threading.Lock()
        self._rng = random.Random(self.seed)
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/v1"

    # --- counters --------------------------------------------------------------------------------

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()

    @property
    def calls(self) -> int:
        """Requests answered with a usable completion (faults not counted)."""
        with self._lock:
            return sum(1 for r in self.requests if r.fault is None and r.status == 200)

    @property
    def faults(self) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.fault is not None)

    def ok_requests(self) -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.requests if r.fault is None and r.status == 200]

    # --- answering -------------------------------------------------------------------------------

    def _admit(self, tokens: int) -> float | None:
        """Under the token limit: None when admitted, else the seconds until there is room."""
        if self.tokens_per_minute is None:
            return None
        allowed = self.tokens_per_minute * self.limit_window_s / 60.0
        with self._lock:
            now = time.monotonic()
            window = self._window
            while window and window[0][0] <= now - self.limit_window_s:
                window.popleft()
            used = sum(t for _, t in window)
            if used + tokens <= allowed or not window:
                window.append((now, tokens))
                return None
            # Room frees up as the oldest admitted calls leave the window.
            freed, wait = 0, self.limit_window_s
            for stamp, count in window:
                freed += count
                if used - freed + tokens <= allowed:
                    wait = stamp + self.limit_window_s - now
                    break
            return max(wait, 0.001)

    def _charge(self, tokens: int) -> None:
        """Count a completion's tokens against the limit once it is answered."""
        if self.tokens_per_minute is not None:
            with self._lock:
                self._window.append((time.monotonic(), tokens))

    @property
    def throttled(self) -> int:
        """Requests refused by the token limit (not injected faults)."""
        with self._lock:
            return sum(1 for r in self.requests if r.fault == "limit")

    def _pick_fault(self) -> str | None:
        with self._lock:
            if self.fault_plan:
                return self.fault_plan.pop(0)
            if self.fault_rate > 0 and self._rng.random() < self.fault_rate:
                return self._rng.choice(self.fault_kinds)
        return None

    def _log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)


def count_tokens(text: str) -> int:
    """The usage the fake reports: about four characters a token, as a real server roughly would."""
    return max(1, len(text) // 4)


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        for call in message.get("tool_calls") or []:
            parts.append(str(call.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


def _message(answer: str | dict[str, Any] | Reply, seq: int) -> tuple[dict[str, Any], str]:
    """The assistant message of an answer, and the text its completion tokens are counted on."""
    if not isinstance(answer, Reply):
        content = answer if isinstance(answer, str) else json.dumps(answer)
        return {"role": "assistant", "content": content, "refusal": None}, content
    calls: list[dict[str, Any]] = [
        {
            "id": f"call_{seq}_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for i, c in enumerate(answer.tool_calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    text = (answer.content or "") + "".join(c["function"]["arguments"] for c in calls)
    return message, text


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An answer goes out as two writes (headers, then body); with Nagle's algorithm the
        # body waits for the client's delayed ACK of the headers, 40 ms on Linux, which every
        # call would pay on top of `latency_s`. Real providers send at once.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        # When the answer under way may go out (the request's arrival plus `latency_s`), once
        # the latency applies to it; None before.
        answer_at: float | None = None

        def _send(
            self, status: int, payload: object, headers: dict[str, str] | None = None
        ) -> None:
            data = json.dumps(payload).encode()
            if self.answer_at is not None:
                time.sleep(max(0.0, self.answer_at - time.monotonic()))
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a time-out fault): nothing to answer

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found", "type": "invalid_request"}})

        def do_POST(self) -> None:
            self.answer_at = None
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            arrived = time.monotonic()
            with fake._lock:
                fake.authorizations.append(self.headers.get("Authorization") or "")
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": "not found", "type": "invalid_request"}})
                return
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                self._send(
                    400, {"error": {"message": "body is not JSON", "type": "invalid_request"}}
                )
                return
            response_format = body.get("response_format") or {}
            if not fake.structured_output and response_format.get("type") == "json_schema":
                fake._log(LoggedRequest(body, None, None, 400))
                self._send(
                    400,
                    {
                        "error": {
                            "message": "response_format json_schema is not supported",
                            "type": "invalid_request_error",
                            "param": "response_format",
                        }
                    },
                )
                return
            # The model's latency is the whole time from the request's arrival to its answer:
            # the server's own work (parsing, counting, scripting the answer) is done inside it,
            # as a provider's is inside the latency it shows, so that `latency_s` is what a
            # client measured against it (benchmarks compute their ideal from it) sees.
            self.answer_at = arrived + fake.latency_s
            prompt_tokens = count_tokens(_prompt_text(body))
            if fake.context_tokens is not None and prompt_tokens > fake.context_tokens:
                fake._log(LoggedRequest(body, None, None, 400))
                refusal = (
                    f"This model's maximum context length is {fake.context_tokens} tokens. "
                    f"However, your messages resulted in {prompt_tokens} tokens."
                )
                error = {
                    "message": refusal,
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
                self._send(400, {"error": error})
                return
            wait_s = fake._admit(prompt_tokens)
            if wait_s is not None:
                fake._log(LoggedRequest(body, "limit", None, 429))
                self.answer_at = None  # a provider refuses over its limit at once
                self._send(
                    429,
                    {"error": {"message": "tokens per minute exceeded", "type": "tokens"}},
                    {"retry-after-ms": str(int(wait_s * 1000) + 1)},
                )
                return
            fault = fake._pick_fault()
            if fault == "429":
                fake._log(LoggedRequest(body, fault, None, 429))
                self._send(
                    429,
                    {"error": {"message": "rate limited", "type": "rate_limit_exceeded"}},
                    {"retry-after-ms": "0"},
                )
                return
            if fault == "500":
                fake._log(LoggedRequest(body, fault, None, 500))
                self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
                return
            if fault == "timeout":
                fake._log(LoggedRequest(body, fault, None, 200))
                time.sleep(fake.timeout_sleep_s)
                # fall through and answer late: the client has given up by now
            try:
                answer = fake.answer(body)
            except Exception as exc:  # a broken script must show up, not hang the client
                fake._log(LoggedRequest(body, None, None, 500))
                self._send(500, {"error": {"message": f"answer raised {exc!r}", "type": "test"}})
                return
            message, content = _message(answer, time.monotonic_ns())
            if fault == "malformed":
                if message.get("content") is not None:
                    message["content"] = content = content[: max(1, len(content) // 2)]
                fake._log(LoggedRequest(body, fault, content, 200))
            elif fault is None:
                fake._log(LoggedRequest(body, None, content, 200))
            completion_tokens = count_tokens(content)
            self._send(
                200,
                {
                    "id": f"chatcmpl-fake-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                },
            )
            fake._charge(completion_tokens)  # answered now, after the latency

    return Handler
