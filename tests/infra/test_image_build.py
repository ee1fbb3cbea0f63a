"""Image building: reproducible contexts and content-addressed tags (no engine needed here;
the engine path is exercised by scripts/services/20-docker.sh and every Docker test)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from infra.image_build import (
    BASE_PACKAGES,
    ImageBuildError,
    base_image_tag,
    build_context,
)


def test_context_holds_dockerfile_and_host_cas(tmp_path: Path) -> None:
    (tmp_path / "corp.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "ignored.pem").write_text("x")
    data = build_context("workspace.Dockerfile", tmp_path)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        dockerfile = tar.extractfile("Dockerfile").read().decode()  # type: ignore[union-attr]
    assert names == [
        "ca",
        "Dockerfile",
        "ca/corp.crt",
        "task",
        "labextensions/baseline-lab/package.json",
        "labextensions/baseline-lab/static/remoteEntry.js",
    ]
    assert "ARG BASE" in dockerfile and "USER participant" in dockerfile
    assert "COPY task /usr/local/bin/task" in dockerfile
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getmember("task").mode == 0o755  # COPY keeps it executable


def test_context_is_reproducible_and_changes_with_inputs(tmp_path: Path) -> None:
    first = build_context("workspace.Dockerfile", tmp_path)
    assert build_context("workspace.Dockerfile", tmp_path) == first
    (tmp_path / "new.crt").write_text("cert")
    assert build_context("workspace.Dockerfile", tmp_path) != first


def test_cuda_dockerfile_keeps_the_same_layout() -> None:
    data = build_context("workspace-cuda.Dockerfile", Path("/nonexistent"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        text = tar.extractfile("Dockerfile").read().decode()  # type: ignore[union-attr]
    assert text.startswith("# The GPU workspace image")
    for needle in ("FROM nvidia/cuda", "useradd", "/home/submission", "USER participant"):
        assert needle in text


def test_base_tag_depends_on_suite_and_packages_only() -> None:
    assert base_image_tag() == base_image_tag("bookworm", tuple(reversed(BASE_PACKAGES)))
    assert base_image_tag() != base_image_tag("trixie")
    assert base_image_tag() != base_image_tag("bookworm", (*BASE_PACKAGES, "vim"))


def test_unknown_dockerfile_is_refused() -> None:
    with pytest.raises(ImageBuildError, match="no Dockerfile"):
        build_context("nope.Dockerfile")
