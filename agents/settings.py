"""An agent configuration's settings: its model, its limits and how its time is counted.

Everything that could make an agent's attempt differ from a human's is one of these fields, so it
is stored with the run (`AgentRun.settings`) and reported with the results, never an accident.
A study enrols an agent with a flat dictionary (``Participant.agent_limits``) whose keys are the
fields of `AgentModelConfig` and of `AgentSettings`; `from_flat` splits and validates it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.model import AgentModelConfig
from agents.scaffold import REMINDER_EVERY_STEPS


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: AgentModelConfig
    # Whether model generation time is working time (PaperBench and Vivaria: it is).
    generation_counts: bool = True
    tool_timeout_s: float = Field(default=1_800.0, gt=0)
    shown_output_bytes: int = Field(default=16_000, ge=256)
    token_limit: int | None = Field(default=None, ge=1)  # prompt + completion, whole attempt
    cost_limit_usd: float | None = Field(default=None, gt=0)
    reminder_every_steps: int = Field(default=REMINDER_EVERY_STEPS, ge=1)
    # Retries of a failing model call (429, 5xx, time-outs); the wait is a rate_limit pause.
    max_call_attempts: int = Field(default=100, ge=1)
    backoff_initial_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    # How often a run paused by a coordinator looks again.
    pause_poll_s: float = Field(default=5.0, gt=0)


class SettingsError(ValueError):
    """The enrolled configuration is not usable; the message names the fields."""


def from_flat(base_url: str, model: str, flat: dict[str, Any] | None) -> AgentSettings:
    values = dict(flat or {})
    model_keys = set(AgentModelConfig.model_fields) - {"base_url", "model"}
    model_values = {k: values.pop(k) for k in list(values) if k in model_keys}
    try:
        config = AgentModelConfig(base_url=base_url, model=model, **model_values)
        return AgentSettings(model=config, **values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise SettingsError(f"agent settings: {problems}") from exc
