"""Run one command, once, in a Task Standard family's image: how a family is inspected and scored.

A family's ``get_tasks()`` and ``get_instructions()`` often need what its ``install()`` put in the
image (packages, downloaded files), and they are third-party code: they run here, in a throwaway
container of the family's own image, never on the portal's host. The container has no network, no
capabilities and bounded memory and processes; it is killed at the time-out and always removed.
A family's ``start()`` runs the same way, given the network, environment and GPUs of the
workspace it starts (`run_once`'s ``network``, ``environment``, ``gpu_ids``).

A family is scored the same way, in a container of its attempt's saved state (`commit_state`: the
workspace's file system as the task left it, ``start()``'s files included) with the attempt's
submission volume mounted read-only, and the GPUs its caller holds for it (``gpu_ids``), under a
``name`` its caller can remove it by; a state saved for that one scoring is tagged after the
name (`scoring_state_tag`), so that the name, recorded before either exists, removes both should
the scoring's process die (`remove_scoring_run`). Only that short-lived container may be given
the few capabilities the Task Standard's scoring needs (`run_once`'s ``cap_add``: root reading
the agent's files, ``chown agent``, ``runuser -u agent``); the participant's workspace never has
them.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeGuard

import docker
from docker.errors import DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import Mount
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import ReadTimeout

from infra.gpus import device_request

LOCAL_ENGINE = "unix:///var/run/docker.sock"  # the portal host's own engine
RUN_LABEL = "baseline.family-run"  # on every such container, for leak checks
# What a saved state is (`commit_state`): a commit inherits its image's labels, and a state of a
# workspace said "baseline.image=workspace", so a host check took it for a workspace image to
# probe isolation with; removed by its scoring meanwhile, the probe's run tried to pull it from
# a registry and the healthy host was marked unhealthy.
STATE_IMAGE_LABELS = {RUN_LABEL: "state", "baseline.image": "scoring-state"}
STATE_REPOSITORY = "baseline-family-state"  # saved workspace states (`commit_state`)
SCORING_RUN_PREFIX = "baseline-family-score-"  # a scoring run's container (`scoring_run_name`)
MEMORY_LIMIT = "4g"
PIDS_LIMIT = 512


class FamilyRunError(RuntimeError):
    """The engine could not run the command at all (the command's own failure is a result)."""


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: it ran past the time-out and was killed
    stdout: str
    stderr: str


def run_once(
    client: docker.DockerClient,
    image: str,
    command: list[str],
    *,
    workdir: str,
    timeout_s: float,
    labels: dict[str, str] | None = None,
    cap_add: Sequence[str] = (),
    volumes_ro: Mapping[str, str] | None = None,
    files: Mapping[str, bytes] | None = None,
    memory: str = MEMORY_LIMIT,
    after: Callable[[Container], None] | None = None,
    network: str = "none",
    dns: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    gpu_ids: Sequence[str] = (),
    archive: bytes | None = None,
    name: str | None = None,
) -> RunResult:
    """Run `command` as root in a new container of `image` and remove it; its exit and output.

    `cap_add` are the only capabilities it gets (none by default); `volumes_ro` mounts named
    volumes read-only (volume name: path); `files` (absolute path: content, root's, 0600) and
    `archive` (a tar extracted at /, its owners and modes kept) are put in before it starts;
    `after` is given the stopped container when the command exited 0. It has no network unless
    `network` names one (with its `dns` servers, as `infra.docker_backend` gives a workspace's)
    and no GPUs unless `gpu_ids` names them (the same device request as a workspace's). `name`
    names the container (Docker's own name otherwise), so that whoever holds its GPUs can remove
    it should this process die."""
    mounts = [
        Mount(target=path, source=volume, type="volume", read_only=True)
        for volume, path in (volumes_ro or {}).items()
    ]
    reach: dict[str, Any] = (
        {"network_disabled": True}
        if network == "none"
        else {"network_mode": network, "dns": list(dns)}
    )
    if environment:
        reach["environment"] = dict(environment)
    if gpu_ids:
        reach["device_requests"] = [device_request(gpu_ids)]
    try:
        container = client.containers.create(
            image,
            command,
            user="root",
            working_dir=workdir,
            name=name,
            **reach,
            cap_drop=["ALL"],
            cap_add=list(cap_add),
            security_opt=["no-new-privileges"],
            mem_limit=memory,
            pids_limit=PIDS_LIMIT,
            mounts=mounts,
            labels={RUN_LABEL: "1", **(labels or {})},
        )
    except DockerException as exc:
        raise FamilyRunError(f"could not create a container of {image}: {exc}") from exc
    try:
        if files:
            container.put_archive("/", _files_tar(files))
        if archive is not None:
            container.put_archive("/", archive)
        container.start()
        exit_code: int | None
        try:
            exit_code = int(container.wait(timeout=timeout_s).get("StatusCode", -1))
        except (ReadTimeout, RequestsConnectionError):
            container.kill()
            exit_code = None
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        if exit_code == 0 and after is not None:
            after(container)
    except DockerException as exc:
        raise FamilyRunError(f"running a container of {image} failed: {exc}") from exc
    finally:
        # Best effort: a container left behind carries RUN_LABEL for the leak check to find.
        with contextlib.suppress(DockerException):
            container.remove(force=True)
    return RunResult(exit_code=exit_code, stdout=stdout, stderr=stderr)


# What a container's diff lists that is the engine's, not the command's, or is not carried.
NOT_CARRIED = ("/proc", "/sys", "/dev", "/run", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf")
KIND_ADDED, KIND_DELETED = 1, 2  # the engine's diff kinds (0: changed)
MODE_DIR = 1 << 31  # the directory bit of the engine's path stat (Go's os.ModeDir)


def _under(path: str, roots: Sequence[str] | set[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@dataclass(frozen=True)
class Changes:
    """What a container's command changed in its file system."""

    added: list[str]  # added paths with no added ancestor (each carried whole)
    changed: list[str]  # changed paths (a changed directory's own entries are listed apart)
    deleted: list[str]


def changes(container: Container) -> Changes:
    """What the stopped container's command changed, the engine's own files left out."""
    try:
        diff = container.diff() or []
    except DockerException as exc:
        raise FamilyRunError(f"could not read what {container.short_id} changed: {exc}") from exc
    added = {str(d["Path"]) for d in diff if d["Kind"] == KIND_ADDED}
    found = Changes(added=[], changed=[], deleted=[])
    for entry in sorted(diff, key=lambda d: str(d["Path"])):
        path = str(entry["Path"])
        if _under(path, NOT_CARRIED) or _under(path, {a for a in added if a != path}):
            continue
        kind = {KIND_ADDED: found.added, KIND_DELETED: found.deleted}.get(entry["Kind"])
        (found.changed if kind is None else kind).append(path)
    return found


@contextlib.contextmanager
def archive_of(container: Container, path: str, *, whole: bool) -> Iterator[BinaryIO | None]:
    """A tar of `path` in the container, spooled to a temporary file (any size costs no memory);
    None for a directory unless `whole` (a changed directory's changed entries are listed apart)."""
    try:
        chunks, stat = container.get_archive(path)
        if not whole and int(stat.get("mode", 0)) & MODE_DIR:
            yield None
            return
        with tempfile.TemporaryFile() as spooled:
            for chunk in chunks:
                spooled.write(chunk)
            spooled.seek(0)
            yield spooled
    except DockerException as exc:
        raise FamilyRunError(f"could not copy {path} out of {container.short_id}: {exc}") from exc


def _files_tar(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def commit_state(
    client: docker.DockerClient,
    container_id: str,
    tag: str,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Save a workspace container's file system (not its volumes) as the image `tag`, with
    `labels` beside STATE_IMAGE_LABELS; its id.

    Works on a running container (paused for the moment it takes) and on a stopped one."""
    repository, _, name = tag.partition(":")
    try:
        image = client.containers.get(container_id).commit(
            repository=repository,
            tag=name,
            conf={"Labels": {**STATE_IMAGE_LABELS, **(labels or {})}},
        )
    except DockerException as exc:
        raise FamilyRunError(f"could not save the state of {container_id[:12]}: {exc}") from exc
    return str(image.id)


def scoring_run_name() -> str:
    """A fresh name for one scoring run in a saved state of the container as it is now: its
    container is named so and its state image tagged after it (`scoring_state_tag`), so that the
    name, recorded before either exists, is all it takes to remove both (`remove_scoring_run`)."""
    return f"{SCORING_RUN_PREFIX}{secrets.token_hex(6)}"


def is_scoring_run(name: str | None) -> TypeGuard[str]:
    """Whether `name` is a scoring run's (`scoring_run_name`), not a workspace's."""
    return name is not None and name.startswith(SCORING_RUN_PREFIX)


def scoring_state_tag(name: str) -> str:
    """The state image saved for the one scoring run whose container is named `name`."""
    return f"{STATE_REPOSITORY}:{name}"


def remove_scoring_run(client: docker.DockerClient, name: str) -> None:
    """Remove a scoring run's container (killed if it still runs) and then its state image,
    those that are there; FamilyRunError when the engine does not answer. The container
    first: an image a container still uses would only be untagged, its layers kept."""
    try:
        with contextlib.suppress(NotFound):
            client.containers.get(name).remove(force=True)
        with contextlib.suppress(ImageNotFound):
            client.images.remove(scoring_state_tag(name), force=True)
    except (DockerException, OSError) as exc:  # requests' connection errors are OSErrors
        raise FamilyRunError(f"could not remove scoring run {name}: {exc}") from exc


def scoring_runs(client: docker.DockerClient, scope: Mapping[str, str]) -> dict[str, float]:
    """The scoring runs this engine holds anything of (a container, a state image) that carry
    the labels `scope` (a deployment's: another portal's runs on a shared engine are not its to
    remove), by name, each with when its oldest part was made (seconds since the epoch);
    FamilyRunError when the engine does not answer. Read from the engine's lists (one call
    each), not per container."""
    scoped = [f"{key}={value}" for key, value in scope.items()]
    made: dict[str, float] = {}

    def seen(name: str, created: object) -> None:
        if is_scoring_run(name) and isinstance(created, int | float):
            made[name] = min(made.get(name, float(created)), float(created))

    try:
        found = client.api.containers(
            all=True, filters={"label": [RUN_LABEL, *scoped], "name": SCORING_RUN_PREFIX}
        )
        for container in found:
            for name in container.get("Names") or []:
                seen(name.lstrip("/"), container.get("Created"))
        for image in client.api.images(name=STATE_REPOSITORY, filters={"label": scoped}):
            for tag in image.get("RepoTags") or []:
                repository, _, name = tag.rpartition(":")
                if repository == STATE_REPOSITORY:
                    seen(name, image.get("Created"))
    except (DockerException, OSError) as exc:  # requests' connection errors are OSErrors
        raise FamilyRunError(f"could not list the scoring runs: {exc}") from exc
    return made


def final_state_tag(container_id: str) -> str:
    """The saved state an ended attempt's final score is taken in: one per workspace container,
    removed with it (`infra.docker_backend.DockerBackend.destroy`)."""
    return f"{STATE_REPOSITORY}:{container_id[:12]}-final"


def state_image(client: docker.DockerClient, tag: str) -> str | None:
    """The id of a saved state (`commit_state`) on this engine; None if it is not there."""
    try:
        return str(client.images.get(tag).id)
    except ImageNotFound:
        return None
    except DockerException as exc:
        raise FamilyRunError(f"could not look up {tag}: {exc}") from exc


def remove_state(client: docker.DockerClient, tag: str) -> None:
    """Remove a saved state; best effort (it carries RUN_LABEL for the leak check)."""
    with contextlib.suppress(DockerException):
        client.images.remove(tag, force=True)
