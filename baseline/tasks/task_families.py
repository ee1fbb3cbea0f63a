"""METR Task Standard task families as Baseline scored tasks: what importing a family stores.

Importing a family folder (``scoring.task_standard`` inspects it in a subprocess) gives one
scored task per name in ``get_tasks()``, with the slug ``<family>-<task>``. The participant sees
only ``instructions.md`` (what ``get_instructions(task)`` returned); the family's code, manifest
and assets are PROTECTED, stored under ``family/`` with Baseline's hook runner beside them. The
scoring spec runs that hook as root in the separate scoring container: ``score(task, submission)``
for a snapshot, ``intermediate_score(task)`` for an intermediate score.

Launching and starting an attempt of a family task is `baseline.attempts.family_launch`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from baseline.errors import InvalidInput
from baseline.models import (
    Attempt,
    FileVisibility,
    TaskKind,
)
from baseline.tasks.planning import PlannedFile, TaskPlan, walk_files
from infra.hardware import ProfileConfigError, load_profiles
from scoring.scored_task import SLUG_RE, Direction, ScoringSpec
from scoring.task_standard import (
    HOOK_NAME,
    HOOK_SOURCE,
    FamilyInfo,
    TaskInfo,
    TaskStandardError,
    choose_profile,
    hook_command,
    inspect_family,
)

FAMILY_DIR = "family"  # where the family's files are stored within the task
INSTRUCTIONS = "instructions.md"


def _spec(info: FamilyInfo, name: str, task: TaskInfo) -> ScoringSpec:
    if task.starting_score is None or task.reference_score is None:
        raise InvalidInput(
            f"family {info.name}: task {name!r} has no starting_score/reference_score in its "
            "get_tasks() dict; Baseline normalises scores (starting solution 0, reference 1) "
            "and needs both"
        )
    try:
        return ScoringSpec(
            script=f"{FAMILY_DIR}/{HOOK_NAME}",
            command=hook_command(info.name, "score", name),
            user="root",
            starting_score=task.starting_score,
            reference_score=task.reference_score,
            direction=Direction(task.direction or Direction.HIGHER.value),
            log_transform=task.log_transform,
            # Always the intermediate hook: a family without intermediate_score() gets a clear
            # "no score" rather than its final score() run silently in its place.
            intermediate_command=hook_command(info.name, "intermediate", name),
        )
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InvalidInput(f"family {info.name}: task {name!r}: {message}") from exc
    except ValueError as exc:  # an unknown score_direction
        raise InvalidInput(f"family {info.name}: task {name!r}: {exc}") from exc


def plan_family(folder: Path) -> list[TaskPlan]:
    """One scored-task plan per task of the family; nothing is stored."""
    try:
        info = inspect_family(folder)
        profiles = load_profiles()
    except (TaskStandardError, ProfileConfigError) as exc:
        raise InvalidInput(str(exc)) from exc
    skipped: list[str] = []
    family_files = [
        PlannedFile(
            f"{FAMILY_DIR}/{path.relative_to(folder).as_posix()}", path, FileVisibility.PROTECTED
        )
        for path in walk_files(folder, folder, skipped)
        if "__pycache__" not in path.relative_to(folder).parts
    ]
    hook = PlannedFile(f"{FAMILY_DIR}/{HOOK_NAME}", HOOK_SOURCE, FileVisibility.PROTECTED)
    plans: list[TaskPlan] = []
    for name, task in info.tasks.items():
        slug = f"{info.name}-{name}".lower()
        if not SLUG_RE.match(slug):
            raise InvalidInput(f"family {info.name}: task {name!r} gives an unusable id {slug!r}")
        spec = _spec(info, name, task)
        try:
            profile = choose_profile(task.resources, profiles)
        except TaskStandardError as exc:
            raise InvalidInput(f"family {info.name}: task {name!r}: {exc}") from exc
        standard = {
            "family": info.name,
            "task": name,
            "standard_version": info.standard_version,
            "hooks": info.hooks,
            "permissions": task.permissions,
            "required_environment_variables": info.required_environment_variables,
            "resources": task.resources.model_dump(mode="json", exclude_none=True),
            "hardware_profile": profile,
        }
        scoring: dict[str, Any] = spec.model_dump(mode="json")
        scoring.update(instructions=INSTRUCTIONS, starting_files=None, task_standard=standard)
        instructions = PlannedFile(
            INSTRUCTIONS, folder, FileVisibility.PARTICIPANT, task.instructions.encode()
        )
        summary = {
            "starting_score": spec.starting_score,
            "reference_score": spec.reference_score,
            "direction": spec.direction.value,
            "log_transform": spec.log_transform,
            "task_standard": standard,
        }
        files = sorted([instructions, hook, *family_files], key=lambda f: f.path)
        title = f"{info.name}/{name}"
        plans.append(
            TaskPlan(folder, TaskKind.SCORED, slug, title, files, list(skipped), summary, scoring)
        )
    return plans


def standard_of(attempt: Attempt) -> dict[str, Any] | None:
    """The Task Standard settings of the attempt's task (None: not a family task)."""
    standard = (attempt.task.scoring or {}).get("task_standard")
    return standard if isinstance(standard, dict) else None
