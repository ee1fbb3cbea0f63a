"""RE-Bench style scored tasks: the spec, its folder format, and score normalisation.

A scored task is graded by running its scoring script rather than by a judge. The raw metric is
normalised so that the starting solution scores 0 and the reference solution scores 1::

    normalised = (f(raw) - f(start)) / (f(reference) - f(start))

where ``f`` is the identity, or ``log`` when the task says so (some metrics span orders of
magnitude), or ``log(x - floor)`` with ``log_floor`` (RE-Bench's normalisation of a loss that
cannot go below a known floor). Scores above 1 (better than the reference) and below 0 are kept.
The direction says whether higher or lower raw values are better; it must agree with the starting
and reference scores (for "lower", the reference is below the start), and the formula then needs
no sign flip.

Folder format (``task.yaml`` at the top; every path relative to the folder)::

    id: digits-accuracy              # slug, [a-z0-9][a-z0-9._-]*
    title: Improve a digits classifier
    instructions: instructions.md    # shown to the participant
    starting_files: starting         # a directory (or file) copied into the submission at start
    scoring:
      script: scoring/score.py       # run at scoring time; never shown to the participant
      command: python3 {script} --submission {submission}   # optional; this is the default
      protected: [protected]         # files/dirs readable only at scoring time
      starting_score: 0.91
      reference_score: 0.99
      direction: higher              # or lower
      log_transform: false
      timeout_s: 600

The scoring script prints, as its last non-empty stdout line, either a bare number or a JSON
object ``{"score": <number or null>, "message": "..."}`` (see :func:`parse_score_output`).
Running it in a container belongs to the scoring runner; this module only defines the contract.
"""

from __future__ import annotations

import enum
import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

TASK_FILE = "task.yaml"
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
DEFAULT_COMMAND = "python3 {script} --submission {submission}"


class ScoredTaskError(ValueError):
    """A scored-task folder or score that cannot be used; the message says which field."""


class Direction(enum.StrEnum):
    HIGHER = "higher"
    LOWER = "lower"


def _relative(value: str, field_name: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{field_name} must be a relative path inside the task folder: {value!r}")
    return str(path)


class ScoringSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str
    command: str = DEFAULT_COMMAND
    protected: tuple[str, ...] = ()
    starting_score: float = Field(allow_inf_nan=False)
    reference_score: float = Field(allow_inf_nan=False)
    direction: Direction = Direction.HIGHER
    log_transform: bool = False
    log_floor: float | None = Field(default=None, allow_inf_nan=False)  # f = log(x - floor)
    timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    # The user the command runs as in the scoring container (None: the image's own user). A Task
    # Standard family scores as root, as the standard says.
    user: str | None = None
    # The command for an intermediate score, when it differs from the final one (Task Standard:
    # intermediate_score(task) rather than score(task, submission)).
    intermediate_command: str | None = None

    @field_validator("script")
    @classmethod
    def _script(cls, value: str) -> str:
        return _relative(value, "script")

    @field_validator("protected")
    @classmethod
    def _protected(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_relative(v, "protected") for v in value)

    @model_validator(mode="after")
    def _consistent(self) -> ScoringSpec:
        start, reference = self.starting_score, self.reference_score
        if reference == start:
            raise ValueError(
                f"reference_score equals starting_score ({start}): nothing to normalise against"
            )
        if self.direction is Direction.HIGHER and reference < start:
            raise ValueError(
                f"direction is 'higher' but reference_score {reference} < starting_score {start}"
            )
        if self.direction is Direction.LOWER and reference > start:
            raise ValueError(
                f"direction is 'lower' but reference_score {reference} > starting_score {start}"
            )
        floor = self.log_floor
        if floor is not None and not self.log_transform:
            raise ValueError("log_floor needs log_transform")
        if self.log_transform and min(start, reference) <= (floor or 0.0):
            raise ValueError(
                f"log_transform needs starting_score and reference_score > {floor or 0:g}"
            )
        return self

    def normalise(self, raw: float) -> float:
        """(f(raw) - f(start)) / (f(reference) - f(start)); ScoredTaskError for unusable raw."""
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise ScoredTaskError(f"raw score must be a finite number, got {raw!r}")
        floor = self.log_floor or 0.0

        def transform(value: float) -> float:
            return math.log(value - floor) if self.log_transform else float(value)

        if self.log_transform and raw <= floor:
            raise ScoredTaskError(
                f"raw score {raw} cannot be log-transformed (must be > {floor:g})"
            )
        start = transform(self.starting_score)
        # + 0.0: the starting score of a lower-is-better task is 0 / negative = -0.0, which
        # every table, caption and export printed as "-0.000".
        return (transform(raw) - start) / (transform(self.reference_score) - start) + 0.0

    def render_command(self, script_path: str, submission_path: str) -> str:
        return self.command.format(script=script_path, submission=submission_path)

    def for_intermediate(self) -> ScoringSpec:
        """The spec an intermediate score runs with (the same, unless a command is given)."""
        if self.intermediate_command is None:
            return self
        return self.model_copy(update={"command": self.intermediate_command})


class ScoredTaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    title: str = Field(min_length=1, max_length=500)
    instructions: str = "instructions.md"
    starting_files: str | None = None
    scoring: ScoringSpec

    @field_validator("id")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not SLUG_RE.match(value):
            raise ValueError(
                f"must be a slug of lower-case letters, digits, '.', '_', '-': {value!r}"
            )
        return value

    @field_validator("instructions", "starting_files")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return None if value is None else _relative(value, "path")


def _format_validation(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "<root>"
    message = first["msg"].removeprefix("Value error, ")
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {where}: {message}{suffix}"


def parse_spec(data: Any, source: str = TASK_FILE) -> ScoredTaskSpec:
    if not isinstance(data, dict):
        raise ScoredTaskError(f"{source}: must be a mapping of settings")
    try:
        return ScoredTaskSpec.model_validate(data)
    except ValidationError as exc:
        raise ScoredTaskError(_format_validation(exc, source)) from exc


def load_scored_task(folder: Path) -> ScoredTaskSpec:
    """Read and check ``folder/task.yaml``: the spec must parse and every named path exist."""
    path = folder / TASK_FILE
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScoredTaskError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ScoredTaskError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    spec = parse_spec(data, str(path))
    named = [("instructions", spec.instructions), ("scoring.script", spec.scoring.script)]
    if spec.starting_files is not None:
        named.append(("starting_files", spec.starting_files))
    named += [(f"scoring.protected[{i}]", p) for i, p in enumerate(spec.scoring.protected)]
    for field_name, relative in named:
        if not (folder / relative).exists():
            raise ScoredTaskError(f"{path}: {field_name}: {relative} does not exist in {folder}")
    return spec


def parse_score_output(stdout: str) -> tuple[float | None, str]:
    """The raw score from a scoring script's output: (score or None, message).

    The last non-empty line is read: a bare number, or ``{"score": x, "message": "..."}``. A null
    score means the script ran but found nothing to score (its message says why). Anything else is
    a ScoredTaskError: a broken script is never a silent zero.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ScoredTaskError("the scoring script printed nothing")
    last = lines[-1]
    try:
        value: Any = json.loads(last)
    except ValueError as exc:
        raise ScoredTaskError(
            f"the scoring script's last line is not a score: {last[:200]!r}"
        ) from exc
    message = ""
    if isinstance(value, dict):
        message = str(value.get("message", ""))
        if "score" not in value:
            raise ScoredTaskError(f"the scoring script's JSON has no 'score': {last[:200]!r}")
        value = value["score"]
    if value is None:
        return None, message
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScoredTaskError(f"the scoring script's score is not a finite number: {value!r}")
    return float(value), message
