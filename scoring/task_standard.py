"""METR Task Standard task families: reading a family folder, its manifest and its hooks.

A family folder holds ``<family>.py`` (defining ``class TaskFamily``), optionally
``manifest.yaml`` (per-task resources), and its assets. The family's code never runs on the
portal's host: it is inspected by running :mod:`scoring.task_standard_hook` in a throwaway,
offline container of the family's own image (``install()`` run, so ``get_tasks()`` may use what it
installed) with a time-out, and later run by that same hook as root in start's setup container
(``start``: `baseline.attempts.family_launch`) and in a container of the attempt's state
(``score``, ``intermediate_score``: `scoring.task_standard_scoring`).

A family is scored by ``score(task, submission)``, or, as RE-Bench's are (the standard says a
family should not define both), by ``intermediate_score(task)`` with ``aggregate_scores(task,
score_log)`` giving the final score from the intermediate ones. A family with neither (Vivaria's
hand-scored ones, e.g. gpu_inference) is refused at import, saying so: Baseline's graders score
rubric leaves of paper tasks, and a family task imported with no way to score it would collect
attempts that never get a score.

A family without ``standard_version`` (Vivaria's older examples) is read as the oldest supported
version, with a warning. Normalisation constants are `scoring.task_standard_normalisation`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import yaml
from docker.errors import DockerException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.family_run import LOCAL_ENGINE, FamilyRunError, run_once
from infra.hardware import ProfileConfig, ProfileConfigError
from infra.image_build import ImageBuildError, build_family_image, build_workspace_image
from scoring.task_standard_hook import FAMILY_HOME, SCORE_LOG_NAME

HOOK_SOURCE = Path(__file__).with_name("task_standard_hook.py")
HOOK_NAME = "_baseline_task_standard_hook.py"
MANIFEST = "manifest.yaml"
# Versions whose hooks (get_tasks, get_instructions, get_permissions, start, score,
# intermediate_score) behave as the hook runner expects.
SUPPORTED_VERSIONS = ("0.2", "0.3", "0.4", "0.5")
TASK_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
FAMILY_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,99}$")
FULL_INTERNET = "full_internet"
AGENT_HOME = "/home/agent"  # the Task Standard's agent home (see task_standard_hook)
# Inspection needs no accelerator: every family is inspected in its image built on this profile's
# workspace image (at launch it is built on the study's profile's).
INSPECTION_PROFILE = "cpu"


class TaskStandardError(ValueError):
    """A family folder that cannot be used; the message says which family and why."""


class GpuRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    count_range: tuple[int, int]
    model: str | None = None


class Resources(BaseModel):
    """A task's resources as the manifest gives them (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GpuRequest | None = None
    cpus: float | None = Field(default=None, gt=0)
    memory_gb: float | None = Field(default=None, gt=0)
    storage_gb: float | None = Field(default=None, gt=0)

    def shortfall(self, profile: ProfileConfig) -> list[str]:
        """What the profile lacks for these resources (empty: it satisfies them)."""
        missing: list[str] = []
        if self.cpus is not None and profile.cpus < self.cpus:
            missing.append(f"{self.cpus:g} CPUs (profile has {profile.cpus:g})")
        if self.memory_gb is not None and profile.memory_mb < self.memory_gb * 1024:
            missing.append(f"{self.memory_gb:g} GB memory (profile has {profile.memory_mb} MB)")
        if self.storage_gb is not None and (profile.disk_gb or 0) < self.storage_gb:
            missing.append(f"{self.storage_gb:g} GB storage (profile has {profile.disk_gb} GB)")
        if self.gpu is not None:
            low, high = self.gpu.count_range
            if not low <= profile.gpu_count <= high:
                missing.append(f"{low}-{high} GPUs (profile has {profile.gpu_count})")
            elif self.gpu.model and self.gpu.model.lower() not in (profile.gpu_model or "").lower():
                missing.append(f"GPU model {self.gpu.model} (profile has {profile.gpu_model})")
        return missing


class TaskInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    instructions: str
    permissions: list[str] = []
    fields: dict[str, float | str | bool] = {}  # the task dict's scalars (task_standard_hook)
    aux_vm: bool = False  # get_aux_vm_spec(task) asked for an auxiliary VM
    resources: Resources = Resources()


class FamilyInfo(BaseModel):
    """What inspecting a family told us, with the manifest's resources merged in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    standard_version: str
    required_environment_variables: list[str] = []
    hooks: list[str] = []
    tasks: dict[str, TaskInfo]
    warnings: list[str] = []


def is_family_folder(folder: Path) -> bool:
    return (folder / f"{folder.name}.py").is_file()


def _version_ok(version: object) -> bool:
    if not isinstance(version, str):
        return False
    return any(version == v or version.startswith(v + ".") for v in SUPPORTED_VERSIONS)


def load_manifest(folder: Path) -> dict[str, Resources]:
    """Per-task resources from ``manifest.yaml`` (task names at the top, or under ``tasks``)."""
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskStandardError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    if isinstance(data, dict) and isinstance(data.get("tasks"), dict):
        data = data["tasks"]
    if not isinstance(data, dict):
        raise TaskStandardError(f"{path}: must map task names to their settings")
    resources: dict[str, Resources] = {}
    for name, body in data.items():
        raw = (body or {}).get("resources", {}) if isinstance(body, dict) else None
        if not isinstance(raw, dict):
            raise TaskStandardError(f"{path}: task {name!r}: resources must be a mapping")
        try:
            resources[str(name)] = Resources.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise TaskStandardError(
                f"{path}: task {name!r}: resources.{where}: {first['msg']}"
            ) from exc
    return resources


def family_image_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """What goes into the family's image: its files (as Baseline stores them) and the hook."""
    return {**files, HOOK_NAME: HOOK_SOURCE.read_bytes()}


def run_inspection(
    family: str, files: Mapping[str, bytes], engine_url: str, timeout_s: float
) -> str:
    """Build the family's image (the CPU workspace image, the family in /root, ``install()`` run
    as root, cached by content as at launch) and run the hook's ``inspect`` in a throwaway
    container of it, offline; its stdout. ``get_tasks()`` and ``get_instructions()`` then see
    what ``install()`` provided, and no family code runs on the portal's host."""
    try:
        client = docker.DockerClient(base_url=engine_url, use_ssh_client=False)
    except DockerException as exc:
        raise TaskStandardError(
            f"family {family}: inspecting it needs the local Docker Engine, which is not "
            f"reachable: {exc}"
        ) from exc
    try:
        try:
            base = build_workspace_image(client, INSPECTION_PROFILE).tag
            image = build_family_image(
                client, base, family, dict(files), HOOK_NAME, family_dir=FAMILY_HOME
            ).tag
        except (ImageBuildError, ProfileConfigError, DockerException) as exc:
            raise TaskStandardError(
                f"family {family}: its image could not be built (install() failed?): {exc}"
            ) from exc
        command = ["python3", "-B", f"{FAMILY_HOME}/{HOOK_NAME}", family, "inspect"]
        try:
            done = run_once(client, image, command, workdir=FAMILY_HOME, timeout_s=timeout_s)
        except FamilyRunError as exc:
            raise TaskStandardError(f"family {family}: inspecting it failed: {exc}") from exc
    finally:
        client.close()
    if done.exit_code is None:
        raise TaskStandardError(
            f"family {family}: inspecting it ran past {timeout_s:g} s (get_tasks or "
            "get_instructions must not block)"
        )
    if done.exit_code != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise TaskStandardError(f"family {family}: inspecting it failed: {' | '.join(tail)}")
    return done.stdout


def inspect_family(
    folder: Path,
    files: Mapping[str, bytes],
    engine_url: str = LOCAL_ENGINE,
    timeout_s: float = 60.0,
) -> FamilyInfo:
    """Read the family's version, tasks, instructions and permissions; refuse what we cannot run.

    `files` are the family folder's files as Baseline stores them (relative paths); they are
    inspected in the family's own image (`run_inspection`).
    """
    family = folder.name
    if not FAMILY_NAME_RE.match(family):
        raise TaskStandardError(
            f"{folder}: a family name must be a Python module name in lower case, got {family!r}"
        )
    for reserved in (HOOK_NAME, SCORE_LOG_NAME):
        if (folder / reserved).exists():
            raise TaskStandardError(f"{folder}: {reserved} is reserved for Baseline's hook runner")
    resources = load_manifest(folder)  # a bad manifest is refused before any image is built
    output = run_inspection(family, family_image_files(files), engine_url, timeout_s)
    try:
        data: Any = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise TaskStandardError(f"family {family}: inspecting it printed no result") from exc
    version = data.get("standard_version")
    warnings: list[str] = []
    if version is None:
        version = f"{SUPPORTED_VERSIONS[0]}.0"
        warnings.append(
            f"family {family}: TaskFamily has no standard_version; read as {version}, the oldest "
            "supported"
        )
    if not _version_ok(version):
        supported = ", ".join(f"{v}.x" for v in SUPPORTED_VERSIONS)
        raise TaskStandardError(
            f"family {family}: Task Standard version {version!r} is not supported "
            f"(supported: {supported}); set TaskFamily.standard_version"
        )
    hooks = set(data.get("hooks", []))
    if "score" not in hooks and not {"intermediate_score", "aggregate_scores"} <= hooks:
        raise TaskStandardError(
            f"family {family}: TaskFamily has no score(task, submission), nor "
            "intermediate_score(task) with aggregate_scores(task, score_log): it cannot be scored "
            "automatically (Vivaria has a person score such a family by hand; Baseline has no "
            "hand scoring of family tasks, so it is refused rather than imported with no score)"
        )
    unknown = sorted(set(resources) - set(data["tasks"]))
    if unknown:
        raise TaskStandardError(
            f"family {family}: {MANIFEST} names tasks get_tasks() does not have: {unknown}"
        )
    tasks: dict[str, TaskInfo] = {}
    for name, body in data["tasks"].items():
        if not TASK_NAME_RE.match(name):
            raise TaskStandardError(f"family {family}: task name {name!r} is not usable")
        try:
            tasks[name] = TaskInfo.model_validate(
                {**body, "resources": resources.get(name, Resources())}
            )
        except ValidationError as exc:
            raise TaskStandardError(f"family {family}: task {name!r}: {exc}") from exc
    if not tasks:
        raise TaskStandardError(f"family {family}: get_tasks() returned no tasks")
    on_vms = [name for name, task in tasks.items() if task.aux_vm]
    if on_vms:
        raise TaskStandardError(
            f"family {family}: get_aux_vm_spec asks for an auxiliary VM for tasks {on_vms}; "
            "Baseline does not provide auxiliary VMs (the participant works in one container)"
        )
    return FamilyInfo(
        name=family,
        standard_version=version,
        required_environment_variables=data.get("required_environment_variables", []),
        hooks=data.get("hooks", []),
        tasks=tasks,
        warnings=warnings,
    )


def study_refusals(
    standard: Mapping[str, Any],
    profile_name: str,
    profiles: Mapping[str, ProfileConfig],
    egress_policy: str,
) -> list[str]:
    """Why a study with this hardware profile and egress policy cannot run a family task whose
    stored Task Standard settings are `standard` (empty: it can). Checked when the task is added
    to a study, when an attempt of it is created (an agent enrolled) and at launch, so that a
    study never holds a task that would wait pending without saying why."""
    profile = profiles.get(profile_name)
    if profile is None:
        return [f"the study's hardware profile {profile_name!r} is not configured"]
    refusals: list[str] = []
    missing = Resources.model_validate(standard.get("resources", {})).shortfall(profile)
    if missing:
        refusals.append(
            f"needs {'; '.join(missing)}: the study's hardware profile {profile_name!r} does not "
            f"give it (profile {standard.get('hardware_profile')!r} does)"
        )
    full_internet = FULL_INTERNET in standard.get("permissions", [])
    if full_internet and egress_policy == "none":
        refusals.append(
            "asks for full_internet but the study's egress policy is 'none': give the study an "
            "'open' or 'blacklist' policy, or use another task"
        )
    if not full_internet and egress_policy != "none":
        refusals.append(
            "does not ask for full_internet (no internet) but the study's egress policy is "
            f"{egress_policy!r}: set the study's egress policy to 'none'"
        )
    required = standard.get("required_environment_variables") or []
    if required:
        refusals.append(
            f"needs environment variables {', '.join(required)}; Baseline cannot supply study "
            "secrets to task families yet"
        )
    return refusals


def choose_profile(resources: Resources, profiles: dict[str, ProfileConfig]) -> str:
    """The smallest configured hardware profile that satisfies the resources."""
    fitting = [(name, p) for name, p in profiles.items() if not resources.shortfall(p)]
    if not fitting:
        raise TaskStandardError(
            f"no hardware profile satisfies {resources.model_dump(exclude_none=True)} "
            f"(profiles: {', '.join(sorted(profiles))})"
        )
    return min(fitting, key=lambda item: (item[1].gpu_count, item[1].cpus, item[1].memory_mb))[0]


def hook_command(family: str, action: str, task: str) -> str:
    """The scoring command (for ScoringSpec.command) that runs `action` for `task`."""
    return f"python3 {{script}} {family} {action} {task} {{submission}}"
