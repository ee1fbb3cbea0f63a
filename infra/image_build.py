"""Build the workspace images from the Dockerfiles kept in infra/images/.

Two layers, both cached by content so a second build is a no-op:

- the **base image** (tests, CPU profile): no registry is reachable here, so a Debian root file
  system is made with ``debootstrap --variant=minbase`` and imported with the image-import API
  (what ``docker import`` does). Its tag carries a hash of the suite and package list.
- the **workspace image**: the profile's Dockerfile built through the SDK. Its tag carries a hash
  of the build context (Dockerfile plus the host CA bundle) and of the base image id, so the same
  inputs never build twice and changed inputs never reuse a stale image.

Images are pinned by their id (``sha256:...``, the digest of the image configuration), which is
what the backend creates containers from and what attempts record.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import BuildError, ImageNotFound

from infra.hardware import ProfileConfigError, get_profile

IMAGES_DIR = Path(__file__).resolve().parent / "images"
TASK_CLI = IMAGES_DIR / "task_cli.py"
TASK_CLI_NAME = "task"
LAB_EXTENSIONS = IMAGES_DIR / "labextensions"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
BASE_REPOSITORY = "baseline-base"
WORKSPACE_REPOSITORY = "baseline-workspace"
BASE_SUITE = "bookworm"
BASE_MIRROR = "http://deb.debian.org/debian"
# numpy and scikit-learn from Debian make the demo task runnable without pip.
BASE_PACKAGES = (
    "python3",
    "python3-pip",
    "python3-venv",
    "python3-numpy",
    "python3-sklearn",
    "git",
    "ca-certificates",
    "curl",
    "procps",
)
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildError(RuntimeError):
    """An image could not be made; the message carries the failing step's output tail."""


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    digest: str  # the image id, sha256:...
    built: bool  # False when a cached image with the same inputs was reused


def base_image_tag(suite: str = BASE_SUITE, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    key = hashlib.sha256(f"{suite}\n{' '.join(sorted(packages))}".encode()).hexdigest()
    return f"{BASE_REPOSITORY}:{suite}-{key[:12]}"


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return str(client.images.get(ref).id)
    except ImageNotFound:
        return None


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise ImageBuildError(f"{command[0]} failed ({done.returncode}):\n" + "\n".join(tail))


def bootstrap_rootfs(rootfs: Path, suite: str, packages: tuple[str, ...], mirror: str) -> None:
    """A minimal Debian tree with the packages; apt caches dropped to keep the image small."""
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            suite,
            str(rootfs),
            mirror,
        ]
    )
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for child in (rootfs / junk).glob("*"):
            if child.is_file():
                child.unlink()


def ensure_base_image(
    client: docker.DockerClient,
    suite: str = BASE_SUITE,
    packages: tuple[str, ...] = BASE_PACKAGES,
    mirror: str = BASE_MIRROR,
) -> BuiltImage:
    """Bootstrap and import the base image unless one with the same inputs exists."""
    tag = base_image_tag(suite, packages)
    existing = _image_id(client, tag)
    if existing is not None:
        return BuiltImage(tag=tag, digest=existing, built=False)
    with tempfile.TemporaryDirectory(prefix="baseline-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        bootstrap_rootfs(rootfs, suite, packages, mirror)
        archive = Path(tmp) / "rootfs.tar"
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(archive), "."])
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(
            str(archive),
            repository=repository,
            tag=version,
            changes=[f"ENV {PATH_ENV}", "ENV LANG=C.UTF-8", 'CMD ["bash"]'],
        )
    digest = _image_id(client, tag)
    if digest is None:
        raise ImageBuildError(f"importing {tag} reported success but the image is absent")
    return BuiltImage(tag=tag, digest=digest, built=True)


def build_context(dockerfile: str, ca_dir: Path = HOST_CA_DIR) -> bytes:
    """A reproducible build-context tar: the Dockerfile, the host CA certificates under ca/, the
    workspace's `task` command (executable) and Baseline's JupyterLab extensions under
    labextensions/ (prebuilt, written by hand: no JavaScript build)."""
    source = IMAGES_DIR / dockerfile
    if not source.is_file():
        raise ImageBuildError(f"no Dockerfile {dockerfile!r} in {IMAGES_DIR}")
    entries: list[tuple[str, bytes]] = [("Dockerfile", source.read_bytes())]
    certs = sorted(ca_dir.glob("*.crt")) if ca_dir.is_dir() else []
    entries += [(f"ca/{cert.name}", cert.read_bytes()) for cert in certs]
    entries.append((TASK_CLI_NAME, TASK_CLI.read_bytes()))
    entries += [
        (path.relative_to(IMAGES_DIR).as_posix(), path.read_bytes())
        for path in sorted(LAB_EXTENSIONS.rglob("*"))
        if path.is_file()
    ]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo("ca")
        folder.type = tarfile.DIRTYPE
        folder.mode = 0o755
        tar.addfile(folder)
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name == TASK_CLI_NAME else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_workspace_image(
    client: docker.DockerClient, profile: str, profile_file: Path | None = None
) -> BuiltImage:
    """Build (or reuse) the workspace image of a hardware profile; returns its pinned digest."""
    _, config = get_profile(profile, profile_file)
    context = build_context(config.dockerfile)
    needs_base = b"ARG BASE" in (IMAGES_DIR / config.dockerfile).read_bytes()
    buildargs: dict[str, str] = {}
    key = hashlib.sha256(context)
    if needs_base:
        base = ensure_base_image(client)
        buildargs["BASE"] = base.tag
        key.update(base.digest.encode())
    flavour = config.dockerfile.removesuffix(".Dockerfile")
    tag = f"{WORKSPACE_REPOSITORY}:{flavour}-{key.hexdigest()[:16]}"
    labels = {"baseline.image": "workspace", "baseline.dockerfile": config.dockerfile}
    return _build_once(client, context, tag, labels, buildargs=buildargs)


def _build_once(
    client: docker.DockerClient,
    context: bytes,
    tag: str,
    labels: dict[str, str],
    buildargs: dict[str, str] | None = None,
    what: str = "",
) -> BuiltImage:
    """Build `context` as `tag` unless the engine has it already (tags are content hashes)."""
    existing = _image_id(client, tag)
    if existing is not None:
        return BuiltImage(tag=tag, digest=existing, built=False)
    try:
        image, _ = client.images.build(
            fileobj=io.BytesIO(context),
            custom_context=True,
            tag=tag,
            buildargs=buildargs or {},
            rm=True,
            forcerm=True,
            labels=labels,
        )
    except BuildError as exc:
        lines = [str(item.get("stream") or item.get("error") or "") for item in exc.build_log]
        tail = "".join(lines).strip().splitlines()[-15:]
        raise ImageBuildError(
            f"building {tag}{what} failed: {exc.msg}\n" + "\n".join(tail)
        ) from exc
    return BuiltImage(tag=tag, digest=str(image.id), built=True)


FAMILY_REPOSITORY = "baseline-family"
# The Task Standard's own Python package (``metr_task_standard``), which families import as the
# standard's image provides it; written from its documented interface, installed before install().
TASK_STANDARD_PACKAGES = IMAGES_DIR / "task_standard"
FAMILY_DOCKERFILE = """\
FROM {base}
USER root
COPY task-standard/ /tmp/baseline-task-standard/
RUN python3 -c "import shutil, site; shutil.copytree('/tmp/baseline-task-standard', \\
site.getsitepackages()[0], dirs_exist_ok=True)" && rm -rf /tmp/baseline-task-standard
COPY task-family/ {family_dir}/
# The Task Standard's `agent` user is the participant (same uid and gid, home /home/agent), so a
# family's `chown agent:agent` and `runuser -u agent` give the participant's files and processes;
# `protected` is the group metr.task_protected_scoring protects scoring files with.
RUN (id -u agent >/dev/null 2>&1 || (groupadd -o -g "$(id -g participant)" agent \\
 && useradd -o -u "$(id -u participant)" -g agent -M -d /home/agent -s /bin/bash agent)) \\
 && (getent group protected >/dev/null || groupadd protected) \\
 && chmod 700 {family_dir} && cd {family_dir} && python3 {family_dir}/{hook} {family} install
USER participant
WORKDIR /home/submission
"""


def build_family_image(
    client: docker.DockerClient,
    base: str,
    family: str,
    files: dict[str, bytes],
    hook: str,
    family_dir: str = "/root/task-family",
) -> BuiltImage:
    """The workspace image `base` with the Task Standard's package and a family installed (its
    install() run as root at build time, as the standard says); cached by the family's files,
    the package's and the base id."""
    base_id = _image_id(client, base)
    if base_id is None:
        raise ImageBuildError(f"the base image {base} is not on this engine")
    dockerfile = FAMILY_DOCKERFILE.format(
        base=base_id, family_dir=family_dir, hook=hook, family=family
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entries = [("Dockerfile", dockerfile.encode())]
        entries += [
            (
                f"task-standard/{path.relative_to(TASK_STANDARD_PACKAGES).as_posix()}",
                path.read_bytes(),
            )
            for path in sorted(TASK_STANDARD_PACKAGES.rglob("*.py"))
        ]
        entries += [(f"task-family/{path}", files[path]) for path in sorted(files)]
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    context = buffer.getvalue()
    tag = f"{FAMILY_REPOSITORY}:{family}-{hashlib.sha256(context).hexdigest()[:16]}"
    labels = {"baseline.image": "family", "baseline.family": family}
    return _build_once(client, context, tag, labels, what=" (the family's install)")


def main(argv: list[str] | None = None) -> int:
    """`python -m infra.image_build --profile cpu` prints the tag (for scripts/services)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--docker-url", default="unix:///var/run/docker.sock")
    args = parser.parse_args(argv)
    client = docker.DockerClient(base_url=args.docker_url, use_ssh_client=False)
    try:
        built = build_workspace_image(client, args.profile)
    except (ImageBuildError, ProfileConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(built.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
