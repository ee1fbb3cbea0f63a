"""The agents' model client: chat completions with tools on any OpenAI-compatible endpoint.

One `complete` is one HTTP call and never retries: the run loop retries, because a failed call
opens a `rate_limit` pause on the attempt's clock and the loop owns the clock. The SDK's own
retries are off for the same reason. Every call, failed or not, comes back as a `CallOutcome` with
its start and end times, tokens and cost, so the ledger and the transcript record all of them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import openai

Message = dict[str, Any]


class AgentModelConfig(BaseModel):
    """How an agent reaches its model. The key itself is never stored: only its variable's name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key_env: str = "OPENAI_API_KEY"
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: int = Field(default=4_096, ge=1)
    # US dollars per million tokens; required so that no agent call is ever silently free.
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    timeout_s: float = Field(default=600.0, gt=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok
        ) / 1_000_000


class ContextOverflow(Exception):
    """The conversation no longer fits the model's context window."""


@dataclass(frozen=True)
class CallOutcome:
    """One HTTP call: the assistant message on success, or why it failed."""

    started_at: datetime
    ended_at: datetime
    message: Message | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    error: str | None = None
    retryable: bool = False
    context_overflow: bool = False

    @property
    def ok(self) -> bool:
        return self.message is not None


_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


def _is_overflow(exc: openai.APIStatusError) -> bool:
    body = exc.body if isinstance(exc.body, dict) else {}
    code = str(body.get("code") or getattr(exc, "code", "") or "")
    text = str(exc).lower()
    return code == "context_length_exceeded" or "maximum context length" in text


class ModelClient:
    """A chat-completions client with tools; thread-compatible, one instance per agent run."""

    def __init__(self, config: AgentModelConfig, api_key: str | None = None) -> None:
        self.config = config
        from openai import OpenAI  # imported here: the SDK costs a second at every CLI start

        key = api_key or os.environ.get(config.api_key_env) or "not-needed"
        self._client = OpenAI(
            base_url=config.base_url, api_key=key, max_retries=0, timeout=config.timeout_s
        )

    def close(self) -> None:
        self._client.close()

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "max_completion_tokens": self.config.max_tokens,
        }
        if self.config.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.config.reasoning_effort
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        return kwargs

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> CallOutcome:
        import openai

        started = datetime.now(UTC)
        clock = time.monotonic()
        create: Any = self._client.chat.completions.create
        try:
            completion = create(messages=messages, tools=tools, **self._kwargs())
        except openai.APIStatusError as exc:
            overflow = exc.status_code == 400 and _is_overflow(exc)
            return CallOutcome(
                started_at=started,
                ended_at=_after(started, clock),
                message=None,
                prompt_tokens=0,
                completion_tokens=0,
                cost_usd=0.0,
                error=f"HTTP {exc.status_code}: {exc.message}"[:500],
                retryable=exc.status_code >= 500 or exc.status_code in _RETRYABLE_STATUS,
                context_overflow=overflow,
            )
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            return CallOutcome(
                started, _after(started, clock), None, 0, 0, 0.0, f"{type(exc).__name__}", True
            )
        usage = completion.usage
        prompt = int(usage.prompt_tokens) if usage is not None else 0
        output = int(usage.completion_tokens) if usage is not None else 0
        if not completion.choices:
            return CallOutcome(
                started, _after(started, clock), None, prompt, output,
                self.config.cost(prompt, output), "answer without choices", True,
            )  # fmt: skip
        message = completion.choices[0].message
        return CallOutcome(
            started_at=started,
            ended_at=_after(started, clock),
            message=assistant_message(message.content, message.tool_calls),
            prompt_tokens=prompt,
            completion_tokens=output,
            cost_usd=self.config.cost(prompt, output),
        )


def _after(started: datetime, clock: float) -> datetime:
    """The end of a call on the same monotonic footing as its start (wall clocks can step)."""
    return started + timedelta(seconds=time.monotonic() - clock)


def assistant_message(content: str | None, tool_calls: Any) -> Message:
    """The assistant message as plain JSON, the form it is stored and sent back in."""
    message: Message = {"role": "assistant", "content": content}
    calls = []
    for call in tool_calls or []:
        function = getattr(call, "function", None)
        if function is None:
            continue  # custom (non-function) tool calls are not offered to agents
        calls.append(
            {
                "id": call.id,
                "type": "function",
                "function": {"name": function.name, "arguments": function.arguments},
            }
        )
    if calls:
        message["tool_calls"] = calls
    return message
