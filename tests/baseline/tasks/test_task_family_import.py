"""Importing Task Standard families as real ones are written: no standard_version, constants under
the family's own names (RE-Bench's ``corrupted_loss``/``original_loss``), scores in [0, 1], and
2- and 4-GPU resources.

The family here mirrors RE-Bench's ai_rd_fix_embedding: its task dict holds raw losses, its score
is a loss whose floor is 1.5, and it scores through intermediate_score + aggregate_scores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from baseline.attempts import launch
from baseline.cli import main
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.models import AttemptStatus
from baseline.workspaces import workspaces
from scoring.scored_task import ScoringSpec
from scoring.task_standard import TaskStandardError, inspect_family
from tests.baseline.tasks.test_task_families import (
    _import,
    _study_with,
    factory,
    inspecting_engine,
    local_host,
)
from tests.docker_env import LOCAL_URL, test_image

# Fixtures: the autouse one (importing a family needs the engine), and those of launch tests.
__all__ = ["inspecting_engine", "local_host", "test_image"]

LOSSES = """\
class TaskFamily:
    {version}

    @staticmethod
    def get_tasks():
        return {{"main": {{"corrupted_loss": 10.5, "original_loss": 2.8, "model": "gpt2"}}}}

    @staticmethod
    def get_instructions(t):
        return "Recover the corrupted model's loss."

    @staticmethod
    def intermediate_score(t):
        return {{"score": 5.0, "message": {{}}}}

    @staticmethod
    def aggregate_scores(t, score_log):
        return min(e["score"] for e in score_log)
"""


def write_losses(
    root: Path, *, version: str | None = "0.2.3", sidecar: str | None = None, manifest: str = ""
) -> Path:
    folder = root / "fix_loss"
    folder.mkdir(parents=True)
    line = f"standard_version = {version!r}" if version else "pass"
    (folder / "fix_loss.py").write_text(LOSSES.format(version=line))
    if sidecar is not None:
        (folder / "baseline_scoring.yaml").write_text(sidecar)
    if manifest:
        (folder / "manifest.yaml").write_text(manifest)
    return folder


def _spec(ctx: Context, slug: str = "fix_loss-main") -> ScoringSpec:
    from baseline.tasks import tasks

    with ctx.session() as session:
        task = tasks.find_task(session, slug)
        assert task.scoring is not None
        fields = set(ScoringSpec.model_fields)
        return ScoringSpec.model_validate({k: v for k, v in task.scoring.items() if k in fields})


MAPPED = """\
starting_score: corrupted_loss
reference_score: original_loss
direction: lower
transform: log_minus_floor
floor: 1.5
"""


def test_constants_mapped_from_the_familys_own_fields_in_a_sidecar(
    ctx: Context, tmp_path: Path
) -> None:
    _import(ctx, write_losses(tmp_path, sidecar=MAPPED))
    spec = _spec(ctx)
    assert (spec.starting_score, spec.reference_score) == (10.5, 2.8)
    assert spec.direction.value == "lower" and spec.log_transform and spec.log_floor == 1.5
    # RE-Bench's log(loss - floor), exactly.
    start, reference = math.log(10.5 - 1.5), math.log(2.8 - 1.5)
    expected = (math.log(4.0 - 1.5) - start) / (reference - start)
    assert spec.normalise(4.0) == expected
    assert spec.normalise(10.5) == 0.0 and spec.normalise(2.8) == pytest.approx(1.0)


def test_without_constants_the_refusal_says_where_to_give_them(
    ctx: Context, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput, match=r"no starting_score/reference_score.*--set"):
        _import(ctx, write_losses(tmp_path))


def test_a_field_that_is_not_a_number_is_named(ctx: Context, tmp_path: Path) -> None:
    folder = write_losses(tmp_path, sidecar=MAPPED.replace("original_loss", "model"))
    with pytest.raises(
        InvalidInput,
        match=r"reference_score names the field 'model', which the task's dict does not hold as "
        r"a number \(its number fields: corrupted_loss, original_loss\)",
    ):
        _import(ctx, folder)


def test_scores_already_transformed_get_transformed_constants(ctx: Context, tmp_path: Path) -> None:
    sidecar = MAPPED + "scores_transformed: true\n"
    _import(ctx, write_losses(tmp_path, sidecar=sidecar))
    spec = _spec(ctx)
    assert spec.starting_score == math.log(10.5 - 1.5)
    assert spec.reference_score == math.log(2.8 - 1.5)
    assert not spec.log_transform and spec.log_floor is None
    assert spec.normalise(math.log(2.8 - 1.5)) == 1.0


def test_scores_already_in_unit_range_need_no_constants(ctx: Context, tmp_path: Path) -> None:
    _import(ctx, write_losses(tmp_path, sidecar="normalise: false\n"))
    spec = _spec(ctx)
    assert (spec.starting_score, spec.reference_score, spec.direction.value) == (0, 1, "higher")
    assert spec.normalise(0.37) == pytest.approx(0.37)


def test_per_task_sidecar_settings_must_name_real_tasks(ctx: Context, tmp_path: Path) -> None:
    folder = write_losses(tmp_path, sidecar=MAPPED + "tasks:\n  other: {floor: 1.0}\n")
    with pytest.raises(InvalidInput, match=r"baseline_scoring.yaml names tasks .*\['other'\]"):
        _import(ctx, folder)


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BASELINE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    main(["init", "--admin-password", "a-long-password"])


def test_import_set_maps_constants_and_a_missing_version_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli(tmp_path, monkeypatch)
    folder = write_losses(tmp_path / "family", version=None)
    given = [
        "--set",
        "starting_score=corrupted_loss",
        "--set",
        "reference_score=original_loss",
        "--set",
        "direction=lower",
    ]
    capsys.readouterr()
    main(["task", "import", str(folder), *given])
    out = capsys.readouterr().out
    assert "imported  fix_loss-main" in out
    assert "warning: family fix_loss: TaskFamily has no standard_version; read as 0.2.0" in out
    main(["task", "import", str(folder), *given, "--json"])
    (row,) = json.loads(capsys.readouterr().out)["tasks"]
    assert row["created"] is False and row["warnings"]
    # Other constants are other content: refused, never "unchanged" with the old ones.
    with pytest.raises(SystemExit) as exited:
        main(["task", "import", str(folder), *given, "--set", "transform=log"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "exists with different content" in err
    with pytest.raises(SystemExit) as exited:
        main(["task", "import", str(folder), "--set", "start=1"])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.startswith("error: --set: start: Extra inputs")
    assert "Traceback" not in err


TWO_H100 = "tasks:\n  main:\n    resources:\n      gpu: {count_range: [2, 2], model: h100}\n"


def test_two_gpu_family_imports_and_is_refused_at_launch_without_gpus(
    ctx: Context, tmp_path: Path
) -> None:
    folder = write_losses(tmp_path, sidecar=MAPPED, manifest=TWO_H100)
    _, attempt_id = _study_with(ctx, folder, profile="h100x2")
    with ctx.session() as session:
        workspaces.add_host(session, "cpu-only", LOCAL_URL, None)
    with pytest.raises(InvalidInput, match=r"needs 2 GPU\(s\) \(h100\) and no enabled host"):
        launch.launch(ctx, attempt_id, None, image="unused")


def test_hardware_profiles_extended_by_configuration(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = "tasks:\n  main:\n    resources:\n      gpu: {count_range: [4, 4], model: a10}\n"
    folder = write_losses(tmp_path, sidecar=MAPPED, manifest=manifest)
    with pytest.raises(InvalidInput, match="no hardware profile satisfies"):
        _import(ctx, folder)
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        "profiles:\n  a10x4: {cpus: 32, memory_mb: 131072, gpu_model: NVIDIA A10, gpu_count: 4,"
        " dockerfile: workspace-cuda.Dockerfile}\n"
    )
    monkeypatch.setenv("BASELINE_HARDWARE_PROFILES", str(profiles))
    (task,) = _import(ctx, folder)
    assert task.scoring is not None
    assert task.scoring["task_standard"]["hardware_profile"] == "a10x4"


STANDARD_TYPES = """\
from metr_task_standard.types import GPUSpec, VMSpec


class TaskFamily:
    standard_version = "0.3.0"

    @staticmethod
    def get_tasks():
        return {{"local": {{"vm": False}}, "on_vm": {{"vm": True}}}}

    @staticmethod
    def get_instructions(t):
        return "Answer."

    @staticmethod
    def get_aux_vm_spec(t):
        if not t["vm"] or not {with_vm}:
            return None
        return VMSpec(cpu_count_range=(2, 2), ram_gib_range=(1, 1),
                      gpu_spec=GPUSpec(count_range=(1, 1), model="a10"))

    @staticmethod
    def score(t, submission):
        return float(submission == "yes")
"""


def write_standard_types(root: Path, *, with_vm: bool) -> Path:
    """As Vivaria's gpu_inference and vm_test: the standard's package imported at the top."""
    folder = root / "vm_types"
    folder.mkdir()
    (folder / "vm_types.py").write_text(STANDARD_TYPES.format(with_vm=with_vm))
    (folder / "baseline_scoring.yaml").write_text("normalise: false\n")
    return folder


def test_a_family_importing_the_standards_package_imports(ctx: Context, tmp_path: Path) -> None:
    imported = _import(ctx, write_standard_types(tmp_path, with_vm=False))
    assert sorted(t.slug for t in imported) == ["vm_types-local", "vm_types-on_vm"]


def test_a_family_asking_for_an_auxiliary_vm_is_refused_saying_so(
    ctx: Context, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput, match=r"auxiliary VM for tasks \['on_vm'\]"):
        _import(ctx, write_standard_types(tmp_path, with_vm=True))


@pytest.mark.sqlite_only("the family image's packages")
@pytest.mark.docker
def test_a_family_without_install_starts_with_the_standards_package(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    """Its attempt runs in the family's image too, not the bare workspace image: start() imports
    the family module, which imports the standard's package."""
    folder = write_standard_types(tmp_path, with_vm=False)
    source = (folder / "vm_types.py").read_text()
    (folder / "vm_types.py").write_text(source.replace(', "on_vm": {"vm": True}', ""))
    _, attempt_id = _study_with(ctx, folder)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING


def test_without_an_engine_inspection_says_it_needs_one(tmp_path: Path) -> None:
    folder = write_standard_types(tmp_path, with_vm=False)
    files = {"vm_types.py": (folder / "vm_types.py").read_bytes()}
    with pytest.raises(TaskStandardError, match="needs the local Docker Engine, which is not"):
        inspect_family(folder, files, engine_url=f"unix://{tmp_path}/no-engine.sock")
