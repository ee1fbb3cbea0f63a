"""The egress proxy's image, for engines the portal does not run on (`ssh://` hosts).

On such a host the proxy runs as a container (`infra.egress.container_proxy`), so it needs an image
holding mitmdump and the addon. No registry is reachable from a Docker build here, so nothing is
downloaded at build time: the image is the project's base image (Debian bookworm, Python 3.11,
`infra.image_build`) plus the site-packages of the portal's own egress venv
(`scripts/services/25-egress.sh`), so the remote proxy runs exactly the mitmproxy version the local
one does. The venv's Python must therefore be 3.11 too (its wheels are built for it); anything else
is refused with a clear error rather than producing a proxy that fails at import.

The tag is a hash of what goes in (Dockerfile, addon, rules, the installed distributions with their
versions, the base image id), so the same inputs never build twice, as in `infra.image_build`.
The image also carries util-linux's `nsenter` (from the base), which the engine-host firewall
helper uses (`infra.egress.engine_host`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker

from infra.egress.proxy import ADDON, EgressProxyError, find_mitmdump
from infra.image_build import BuiltImage, ImageBuildError, _build_once, ensure_base_image

PROXY_REPOSITORY = "baseline-egress-proxy"
IMAGE_PYTHON = "python3.11"  # Debian bookworm's, the base image's
PROXY_HOME = "/opt/baseline-egress"
RULES = ADDON.with_name("rules.py")
# Installers and caches: not needed to run mitmdump, and the bulk of the context otherwise.
SKIPPED = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "__pycache__")
# mitmproxy loads a script only once its mtime is past the loader's start value (0): a tar's
# default mtime of 0 would leave the addon silently unloaded. A fixed time keeps the context stable.
CONTEXT_MTIME = 1_700_000_000

DOCKERFILE = f"""\
ARG BASE
FROM ${{BASE}}
COPY site-packages/ {PROXY_HOME}/site-packages/
COPY addon.py rules.py {PROXY_HOME}/
ENV PYTHONPATH={PROXY_HOME}/site-packages PYTHONDONTWRITEBYTECODE=1
"""

# mitmdump's console entry point, run by the image's python3 (argv[1:] are its arguments).
ENTRYPOINT = [
    "python3",
    "-c",
    "import sys; from mitmproxy.tools.main import mitmdump; sys.exit(mitmdump())",
]
ADDON_IN_IMAGE = f"{PROXY_HOME}/addon.py"


def site_packages(mitmdump: str | None = None) -> Path:
    """The egress venv's site-packages, checked to be for the image's Python."""
    venv = Path(mitmdump or find_mitmdump()).resolve().parent.parent
    found = venv / "lib" / IMAGE_PYTHON / "site-packages"
    if not (found / "mitmproxy").is_dir():
        others = sorted(path.parent.name for path in venv.glob("lib/python3*/site-packages"))
        raise ImageBuildError(
            f"the egress venv {venv} has no mitmproxy for {IMAGE_PYTHON} (found: "
            f"{', '.join(others) or 'none'}); the remote proxy image needs one: rerun "
            f"scripts/services/25-egress.sh with BASELINE_EGRESS_PYTHON pointing at {IMAGE_PYTHON}"
        )
    return found


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0].split("-")[0] in SKIPPED or "__pycache__" in relative.parts:
            continue
        if path.is_file() and not path.is_symlink() and path.suffix != ".pyc":
            yield path


def image_key(packages: Path, base_digest: str) -> str:
    """The content hash of the inputs: what is built from, and which distributions (by name and
    version, the dist-info directories) are copied in."""
    key = hashlib.sha256(DOCKERFILE.encode())
    key.update(ADDON.read_bytes())
    key.update(RULES.read_bytes())
    key.update("\n".join(sorted(p.name for p in packages.glob("*.dist-info"))).encode())
    key.update(f"{base_digest}\n{CONTEXT_MTIME}".encode())
    return key.hexdigest()[:16]


def build_context(packages: Path) -> bytes:
    """The build-context tar: the Dockerfile, the addon and rules, the site-packages."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (
            ("Dockerfile", DOCKERFILE.encode()),
            ("addon.py", ADDON.read_bytes()),
            ("rules.py", RULES.read_bytes()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, CONTEXT_MTIME
            tar.addfile(info, io.BytesIO(data))
        for path in _files(packages):
            tar.add(str(path), arcname=f"site-packages/{path.relative_to(packages)}")
    return buffer.getvalue()


def ensure_proxy_image(client: docker.DockerClient, mitmdump: str | None = None) -> BuiltImage:
    """Build (or reuse) the proxy image on the engine of `client`."""
    packages = site_packages(mitmdump)
    base = ensure_base_image(client)
    tag = f"{PROXY_REPOSITORY}:{image_key(packages, base.digest)}"
    labels = {"baseline.image": "egress-proxy"}
    try:
        existing = client.images.get(tag)
        return BuiltImage(tag=tag, digest=str(existing.id), built=False)
    except docker.errors.ImageNotFound:
        pass
    return _build_once(
        client,
        build_context(packages),
        tag,
        labels,
        buildargs={"BASE": base.tag},
        what=" (the egress proxy)",
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m infra.egress.proxy_image` builds the image and prints its tag (for
    scripts/services/25-egress.sh, so a fresh machine has it, or fails there, before the tests)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docker-url", default="unix:///var/run/docker.sock")
    args = parser.parse_args(argv)
    client = docker.DockerClient(base_url=args.docker_url, use_ssh_client=False, timeout=600)
    try:
        built = ensure_proxy_image(client)
    except (ImageBuildError, EgressProxyError, docker.errors.DockerException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(built.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
