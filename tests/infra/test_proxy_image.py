"""The remote proxy's image inputs: the egress venv must match the image's Python, the build
context leaves installers and caches out, and the tag follows what goes in."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from infra.egress import proxy_image
from infra.image_build import ImageBuildError


def _venv(root: Path, python: str) -> str:
    packages = root / "lib" / python / "site-packages"
    for folder in ("mitmproxy", "mitmproxy-11.0.2.dist-info", "pip", "pip-23.2.1.dist-info"):
        (packages / folder).mkdir(parents=True)
    (packages / "mitmproxy" / "__init__.py").write_text("")
    (packages / "mitmproxy" / "__pycache__").mkdir()
    (packages / "mitmproxy" / "__pycache__" / "x.pyc").write_bytes(b"")
    (packages / "pip" / "__init__.py").write_text("")
    (root / "bin").mkdir()
    (root / "bin" / "mitmdump").write_text("")
    return str(root / "bin" / "mitmdump")


def test_a_venv_of_another_python_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageBuildError, match=r"no mitmproxy for python3\.11 \(found: python3\.12"):
        proxy_image.site_packages(_venv(tmp_path, "python3.12"))


def test_the_context_and_the_tag(tmp_path: Path) -> None:
    packages = proxy_image.site_packages(_venv(tmp_path, "python3.11"))
    with tarfile.open(fileobj=io.BytesIO(proxy_image.build_context(packages))) as tar:
        members = {member.name: member for member in tar.getmembers()}
    assert set(members) == {
        "Dockerfile",
        "addon.py",
        "rules.py",
        "site-packages/mitmproxy/__init__.py",
    }
    assert members["addon.py"].mtime > 0  # mitmproxy would not load a script of mtime 0
    key = proxy_image.image_key(packages, "sha256:a")
    assert key == proxy_image.image_key(packages, "sha256:a")
    assert key != proxy_image.image_key(packages, "sha256:b")
    (packages / "mitmproxy-11.0.2.dist-info").rename(packages / "mitmproxy-11.0.3.dist-info")
    assert key != proxy_image.image_key(packages, "sha256:a")
