"""The enrol-agent form: the scaffold chosen from those the code defines, and the settings as
form fields derived from the agents' settings models, so a coordinator never types JSON.

The fields are read off `agents.model.AgentModelConfig` (prices, sampling), `agents.settings.
AgentSettings` (limits, time counting) and, for the ``command`` scaffold, `agents.command.
CommandSpec`: a field added there appears here without a template change. What the form sends
becomes the flat settings dictionary `baseline.studies.agent_enrolment.enrol` validates.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from agents import command as command_agents
from agents import scaffold as scaffolds
from agents.model import AgentModelConfig
from agents.settings import AgentSettings
from baseline.errors import InvalidInput
from baseline.studies.agent_enrolment import API_SCAFFOLD

PREFIX = "setting_"  # form names: apart from the agent's name, model and endpoint fields
# Fields the form asks for on their own (model, endpoint) or that the platform fills.
_NOT_SETTINGS = {"base_url", "model"}


@dataclass(frozen=True)
class Choice:
    name: str
    description: str


@dataclass(frozen=True)
class SettingField:
    """One setting as a form field: `kind` is number, integer, text, choice, yes_no or env."""

    name: str
    kind: str
    required: bool
    default: str
    choices: tuple[str, ...]
    group: str  # "model", "run" or "command": the fieldset it is shown in

    @property
    def form_name(self) -> str:
        return PREFIX + self.name


def scaffold_choices() -> list[Choice]:
    """The built-in scaffolds (registered in `agents.scaffold`), a command agent and an API
    agent: every value `agent_enrolment.enrol` accepts."""
    built_in = [
        Choice(name, _first_line(type(scaffolds.get(name)).__doc__)) for name in scaffolds.names()
    ]
    return [
        *built_in,
        Choice(command_agents.SCAFFOLD, "an external agent program run in the workspace"),
        Choice(API_SCAFFOLD, "an agent running elsewhere that drives its attempts via the API"),
    ]


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""


def setting_fields() -> list[SettingField]:
    return [
        *_fields(AgentModelConfig, "model"),
        *_fields(AgentSettings, "run"),
        *_fields(command_agents.CommandSpec, "command"),
    ]


def _fields(model: type[BaseModel], group: str) -> list[SettingField]:
    return [
        _field(name, info, group)
        for name, info in model.model_fields.items()
        if name not in _NOT_SETTINGS
    ]


def _field(name: str, info: FieldInfo, group: str) -> SettingField:
    base = _without_none(info.annotation)
    choices: tuple[str, ...] = ()
    if base is bool:
        kind = "yes_no"
    elif base is int:
        kind = "integer"
    elif base is float:
        kind = "number"
    elif get_origin(base) is Literal:
        kind, choices = "choice", tuple(str(c) for c in get_args(base))
    elif get_origin(base) is dict:
        kind = "env"
    else:
        kind = "text"
    required = info.is_required()
    default = "" if required or info.default is None or kind == "env" else _shown(info.default)
    return SettingField(name, kind, required, default, choices, group)


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_from_form(form: Mapping[str, str], scaffold: str) -> dict[str, Any]:
    """The flat settings the form gave (empty fields: the model's defaults), typed; the command
    fields belong to the command scaffold only."""
    settings: dict[str, Any] = {}
    for field in setting_fields():
        raw = form.get(field.form_name, "").strip()
        if not raw:
            continue
        if field.group == "command" and scaffold != command_agents.SCAFFOLD:
            raise InvalidInput(f"{field.name}: only a command agent has a command")
        settings[field.name] = _parse(field, raw)
    return settings


def _parse(field: SettingField, raw: str) -> Any:
    try:
        if field.kind == "integer":
            return int(raw)
        if field.kind == "number":
            return float(raw)
    except ValueError:
        raise InvalidInput(f"{field.name}: not a number: {raw[:40]!r}") from None
    if field.kind == "yes_no":
        if raw not in ("yes", "no"):
            raise InvalidInput(f"{field.name}: yes or no")
        return raw == "yes"
    if field.kind == "env":
        return _env(field.name, raw)
    return raw


def _env(name: str, raw: str) -> dict[str, str]:
    """Environment variables, one NAME=value a line."""
    env: dict[str, str] = {}
    for line in raw.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"{name}: one NAME=value a line, got {line.strip()[:40]!r}")
        env[key.strip()] = value
    return env
