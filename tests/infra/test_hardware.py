"""Hardware profiles: built-in defaults and overrides from YAML/TOML files."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.hardware import BUILTIN, ProfileConfigError, get_profile, load_profiles


def test_builtin_profiles_cover_cpu_and_gpu_machines() -> None:
    cpu, config = get_profile("cpu")
    assert cpu.gpu_count == 0 and config.dockerfile == "workspace.Dockerfile"
    h100, config = get_profile("h100")
    assert h100.gpu_count == 1 and "H100" in (h100.gpu_model or "")
    assert config.dockerfile == "workspace-cuda.Dockerfile"
    assert {"cpu", "a10", "h100"} <= set(BUILTIN)


def test_yaml_overrides_and_adds(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "profiles:\n  cpu: {cpus: 2, memory_mb: 4096}\n"
        "  a100: {cpus: 12, memory_mb: 98304, shm_mb: 16384, gpu_model: A100, gpu_count: 2,"
        " dockerfile: workspace-cuda.Dockerfile}\n"
    )
    profiles = load_profiles(path)
    assert profiles["cpu"].cpus == 2 and profiles["cpu"].memory_mb == 4096
    a100, _ = get_profile("a100", path)
    assert (a100.gpu_count, a100.shm_mb, a100.gpu_model) == (2, 16384, "A100")
    assert "h100" in profiles  # built-ins not named in the file stay


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text("[profiles.tiny]\ncpus = 0.5\nmemory_mb = 256\npids = 64\n")
    tiny, _ = get_profile("tiny", path)
    assert (tiny.cpus, tiny.memory_mb, tiny.pids) == (0.5, 256, 64)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("profiles: {x: {cpus: 0, memory_mb: 1}}", "profile 'x': cpus"),
        ("profiles: {x: {cpus: 1}}", "memory_mb"),
        ("profiles: {x: {cpus: 1, memory_mb: 1, gpus: 3}}", "gpus"),
        ("just: text", "top-level `profiles`"),
        ("profiles: [", "not valid"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ProfileConfigError, match=message):
        load_profiles(path)


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileConfigError, match=r"unknown hardware profile 'tpu'.*cpu"):
        get_profile("tpu")
