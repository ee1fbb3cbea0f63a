"""The Docker workspace backend, on the docker SDK, for a local socket or a host over SSH.

One workspace is one container plus named volumes:

- ``<name>-submission`` (or the volume named in the spec, on a restart) at /home/submission: it
  outlives the container, is owned by the non-root participant user (Docker copies the image's
  empty, participant-owned directory into a fresh named volume) and is initialised as a git
  repository on start;
- the task files at /home/paper, read-only: bind-mounted when the engine is local, otherwise copied
  into ``<name>-paper`` through a short-lived helper container (a remote engine cannot see this
  machine's paths) and mounted read-only;
- /home/logs inside the container.

The image is pinned by id (the content digest of its configuration); the profile's limits become
``nano_cpus``, ``mem_limit`` (swap disabled), ``pids_limit`` and ``shm_size``; GPUs become one
``DeviceRequest`` naming the exact device ids the allocator assigned. Everything created carries the
backend's labels plus ``baseline.workspace=<name>``, which is how reconcile finds its own leftovers
and how a test run finds (and proves it removed) everything it made. The Docker socket is never
mounted: no caller can ask for a bind mount other than the task directory.

Networks: `none` or a named network, which must keep its containers apart (`infra.egress.network`);
a workspace never joins Docker's default `bridge`, on which containers reach each other. There is
no routed network: a workspace that may reach the outside does so through the egress proxy, whose
network the host firewalls (a routed bridge reached every service of the host and 169.254.169.254).
"""

from __future__ import annotations

import contextlib
import io
import re
import socket
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import Mount

from infra.disk_images import DiskImageError, DiskImages
from infra.egress.network import isolation_problem
from infra.exec_stream import ExecConnection
from infra.family_run import final_state_tag, remove_state, scoring_state_tag
from infra.gpus import CommandRunner, device_request
from infra.workspace import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ORPHAN_MIN_AGE_S,
    PAPER_DIR,
    SUBMISSION_DIR,
    Archive,
    ExecResult,
    HardwareProfile,
    OutputSink,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
    WorkspaceState,
)

MANAGED_LABEL = "baseline.managed"
WORKSPACE_LABEL = "baseline.workspace"
HELPER_LABEL = "baseline.helper"  # helper containers of a capture (infra.remote_capture)
HELPER_STOPPED_GRACE_S = 600.0
PROFILE_LABEL = "baseline.profile"
# Files that must never reach a workspace (PaperBench's hidden grading material).
FORBIDDEN_TASK_FILES = frozenset({"rubric.json", "judge.addendum.md", "judge_addendum.md"})
# The only DNS server of a workspace on an internal network. Docker's embedded DNS answers the
# network's own names and forwards every other name to its upstream servers: by default the
# host's resolvers (dockerd 20.10 does so on internal networks too), a channel out that bypasses
# the egress proxy. Named as the upstream, the container's own loopback, where no resolver runs,
# outside names go nowhere. Proxied clients never need them: the proxy resolves on the host.
NO_DNS = "127.0.0.1"
# Seconds past an exec's own timeout before the client stops waiting for its stream.
EXEC_GRACE_S = 10.0
# On a volume whose data is a size-bounded disk image of the host (`infra.disk_images`).
DISK_IMAGE_LABEL = "baseline.disk-image"
DISK_SIZE_LABEL = "baseline.disk-size"  # bytes, so that an interrupted creation can be completed
QUOTA_DRIVERS = frozenset({"btrfs", "zfs", "devicemapper", "windowsfilter"})
WORKSPACE_UID = 1000  # the workspace images' participant user
# Where the workspace user can write outside its submission, in the workspace images.
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/run/lock")
USER_DIRS = ("/home/participant", "/home/logs")
ARCHIVE_CHUNK = 1 << 20  # bytes read from the engine at a time when copying a workspace out
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
_STATES = {
    "created": WorkspaceState.CREATED,
    "running": WorkspaceState.RUNNING,
    "restarting": WorkspaceState.RUNNING,
    "paused": WorkspaceState.STOPPED,
    "exited": WorkspaceState.STOPPED,
    "removing": WorkspaceState.DEAD,
    "dead": WorkspaceState.DEAD,
}


def task_tar(task_dir: Path) -> bytes:
    """The task directory as a tar rooted at '.', readable by everyone, owned by root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(task_dir.rglob("*")):
            if path.is_symlink():
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(task_dir)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o555 if info.isdir() else (info.mode | 0o444) & 0o755
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def check_task_dir(task_dir: Path) -> None:
    """Refuse a task directory that holds grading material; mounting it would leak the rubric."""
    if not task_dir.is_dir():
        raise WorkspaceError(f"task directory {task_dir} does not exist")
    leaked = sorted(
        str(p.relative_to(task_dir)) for p in task_dir.rglob("*") if p.name in FORBIDDEN_TASK_FILES
    )
    if leaked:
        raise WorkspaceError(f"task directory {task_dir} holds grading material: {leaked}")


def disk_bytes(profile: HardwareProfile) -> int | None:
    """The profile's disk bound in bytes (None: unbounded)."""
    return None if profile.disk_gb is None else int(profile.disk_gb * (1 << 30))


def bounded_scratch(size_bytes: int) -> dict[str, str]:
    """tmpfs mounts (Docker's ``tmpfs`` option) over every place of the workspace images that
    their user can write to, so that none of it lands in the container's writable layer."""
    size = f"size={max(1, size_bytes >> 20)}m"
    mounts = {path: f"{size},mode=1777" for path in SCRATCH_DIRS}
    owner = f"uid={WORKSPACE_UID},gid={WORKSPACE_UID},mode=0755"
    mounts.update({path: f"{size},{owner}" for path in USER_DIRS})
    return mounts


def _tune_ssh(client: docker.DockerClient) -> None:
    """Two settings of the Docker SDK's SSH transport that cost every remote capture and
    workspace command a few hundred milliseconds:

    - Its connection pools are keyed by the whole request URL, so a request to a URL not seen
      before (every exec's start and inspect: the URL names the exec) opens a new SSH channel
      and starts a new `docker system dial-stdio` on the host, about 0.1 s, while a connection
      to the same engine sits idle. Here every request of the client shares one pool.
    - Nagle's algorithm stays on for its TCP connection: a request with a body (every POST:
      exec, start, archive) leaves as two SSH packets, headers and body, and the second waits
      for the host's delayed ACK of the first, about 40 ms on Linux (an exec's create took
      45 ms over SSH, 2 ms without the wait); the SSH window adjustments of a long download
      wait the same way. It is switched off."""
    api = client.api
    adapter = api.get_adapter(api.base_url)
    ssh_client = getattr(adapter, "ssh_client", None)
    if ssh_client is None:
        return
    get_connection = adapter.get_connection
    base_url = api.base_url

    def one_pool(url: str, proxies: object = None) -> object:
        return get_connection(base_url, proxies)

    setattr(adapter, "get_connection", one_pool)  # noqa: B010  # an instance's own setting
    transport = ssh_client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class DockerBackend:
    """`WorkspaceBackend` on one Docker Engine.

    `labels` are stamped on every container and volume this backend creates and scope
    `reconcile` to them (several backends, such as test runs, can share one engine safely).
    `local` says whether the engine sees this machine's file system (unix socket): then the task
    directory is bind-mounted instead of copied. `disk_quota` bounds what a workspace can write
    by the profile's disk size. The submission volume (an attempt's, which outlives its
    container, as well as a reproduction's or grading's) is a loop-mounted disk image of that
    size on the engine's host (`infra.disk_images`, through `host_runner`: a local subprocess
    or SSH): writing past it fails with ENOSPC. The writable layer gets a storage quota where
    the engine's storage driver has one (overlay2 on XFS, btrfs, zfs, devicemapper); elsewhere
    (overlay2 on ext4, as on this project's machines) every place of the image where the
    (unprivileged) workspace user can write outside the submission (/tmp, /var/tmp, /run/lock,
    its home, /home/logs) is a tmpfs of that size, whose pages also count against the memory
    limit. The root file system stays writable to the engine (copying files in needs it), not
    to the user.
    """

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        local: bool,
        labels: Mapping[str, str] | None = None,
        disk_quota: bool = False,
        host_runner: CommandRunner | None = None,
    ) -> None:
        self.client = client
        self.api = client.api
        self.local = local
        self.labels = {MANAGED_LABEL: "1", **(labels or {})}
        self.disk_quota = disk_quota
        self.disk_images = DiskImages(host_runner) if host_runner is not None else None
        self._quota_driver: bool | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        labels: Mapping[str, str] | None = None,
        disk_quota: bool = False,
        timeout_s: int = 120,
    ) -> DockerBackend:
        """Connect to `unix://...` or `ssh://user@host[:port]` (paramiko, honours ~/.ssh)."""
        try:
            client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=timeout_s)
        except DockerException as exc:
            raise WorkspaceError(f"cannot reach the Docker Engine at {url}: {exc}") from exc
        except Exception as exc:  # paramiko's SSH errors do not share a base with DockerException
            raise WorkspaceError(f"cannot reach the Docker Engine at {url}: {exc}") from exc
        if url.startswith("ssh://"):
            _tune_ssh(client)
        from infra.remote import RemoteError, runner_for_url

        try:
            runner = runner_for_url(url) if disk_quota else None
        except RemoteError as exc:
            raise WorkspaceError(f"no command channel to the host of {url}: {exc}") from exc
        return cls(
            client,
            local=url.startswith("unix://"),
            labels=labels,
            disk_quota=disk_quota,
            host_runner=runner,
        )

    def close(self) -> None:
        self.client.close()
        close_runner = getattr(self.disk_images and self.disk_images.runner, "close", None)
        if callable(close_runner):
            close_runner()

    # -- creation ---------------------------------------------------------------------------

    def create(self, spec: WorkspaceSpec) -> WorkspaceHandle:
        if not _NAME.match(spec.name):
            raise WorkspaceError(f"not a valid workspace name: {spec.name!r}")
        profile = spec.profile
        if profile.gpu_count != len(spec.gpu_device_ids):
            raise WorkspaceError(
                f"profile {profile.name} needs {profile.gpu_count} GPU(s) but "
                f"{len(spec.gpu_device_ids)} were assigned"
            )
        gpus = [str(device) for device in spec.gpu_device_ids]
        if len(set(gpus)) != len(gpus):
            raise WorkspaceError(f"a GPU is assigned twice: {gpus}")
        image_id = self.resolve_image(spec.image)
        labels = {
            **spec.labels,
            **self.labels,
            WORKSPACE_LABEL: spec.name,
            PROFILE_LABEL: profile.name,
        }
        if spec.task_dir is not None:
            check_task_dir(spec.task_dir)
        network_mode, dns = self.network_mode(spec.network)
        made_volumes: list[str] = []
        try:
            submission = spec.submission_volume or f"{spec.name}-submission"
            size = disk_bytes(profile) if self.disk_quota else None
            if self._ensure_volume(submission, labels, size_bytes=size):
                made_volumes.append(submission)
            mounts = [Mount(target=SUBMISSION_DIR, source=submission, type="volume")]
            if spec.task_dir is not None:
                if self.local:
                    source = str(spec.task_dir.resolve())
                    mounts.append(Mount(PAPER_DIR, source, type="bind", read_only=True))
                else:
                    paper = self._paper_volume(spec.name)
                    made_volumes.append(paper)
                    self._fill_paper_volume(paper, spec.task_dir, image_id, labels)
                    mounts.append(Mount(PAPER_DIR, paper, type="volume", read_only=True))
            options: dict[str, Any] = {}
            if size:
                if self.storage_quota_supported():
                    options["storage_opt"] = {"size": str(size)}
                else:
                    options["tmpfs"] = bounded_scratch(size)
            memory = f"{profile.memory_mb}m"
            container = self.client.containers.create(
                image_id,
                name=spec.name,
                hostname="workspace",
                labels=labels,
                environment=dict(spec.env),
                mounts=mounts,
                network_mode=network_mode,
                dns=dns,
                nano_cpus=int(profile.cpus * 1e9),
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=profile.pids,
                shm_size=f"{profile.shm_mb}m",
                device_requests=[device_request(gpus)] if gpus else [],
                init=True,
                security_opt=["no-new-privileges"],
                **options,
            )
        except (APIError, DiskImageError) as exc:
            for volume in made_volumes:
                self._remove_volume(volume)
            if isinstance(exc, DiskImageError):
                raise WorkspaceError(f"creating workspace {spec.name} failed: {exc}") from exc
            if exc.status_code == 409:
                raise WorkspaceError(f"a workspace named {spec.name} exists already") from exc
            raise WorkspaceError(
                f"creating workspace {spec.name} failed: {exc.explanation}"
            ) from exc
        return WorkspaceHandle(
            name=spec.name,
            backend=self.name,
            container_id=str(container.id),
            image_digest=image_id,
            submission_volume=submission,
        )

    def resolve_image(self, image: str) -> str:
        """The pinned id (sha256:...) of an image present on this engine."""
        try:
            return str(self.client.images.get(image).id)
        except ImageNotFound as exc:
            raise WorkspaceError(
                f"image {image} is not on this host; build it with `baseline image build`"
            ) from exc

    def network_mode(self, network: str) -> tuple[str, list[str]]:
        """A workspace container's network and its DNS servers ([]: Docker's default); also a
        family's start's setup container's, which joins its workspace's network
        (`baseline.attempts.family_launch`).

        A named network must exist and keep its containers apart (never Docker's default
        `bridge`, whose containers reach each other); an internal one also gets `NO_DNS`, see
        `NO_DNS`.
        """
        if network == "none":
            return "none", []
        try:
            attrs = self.client.networks.get(network).attrs
        except NotFound as exc:
            raise WorkspaceError(f"network {network!r} does not exist on this host") from exc
        except DockerException as exc:
            raise WorkspaceError(f"network {network!r}: {exc}") from exc
        problem = isolation_problem(network, attrs, internal=None)
        if problem:
            raise WorkspaceError(problem)
        return network, [NO_DNS] if attrs.get("Internal") else []

    def _ensure_volume(
        self, name: str, labels: Mapping[str, str], size_bytes: int | None = None
    ) -> bool:
        """Create the volume unless it exists (a restart reuses it); True when created here.

        With `size_bytes` it binds a disk image of that size on the host, owned by the
        workspace user (`infra.disk_images`): writes past it fail with ENOSPC. The Docker
        volume is the image's record: made before the image and removed after it
        (`_remove_volume`), so a process ended in between leaves a labelled volume that the
        next use completes and a deployment's cleanup finds, never an image nobody knows of."""
        try:
            volume = self.client.volumes.get(name)
        except NotFound:
            pass
        else:
            self._mount_image(volume.attrs)
            return False
        options: dict[str, str] = {}
        if size_bytes is not None:
            images = self._images()
            options = {"type": "none", "o": "bind", "device": images.data_dir(name)}
            labels = {**labels, DISK_IMAGE_LABEL: images.root, DISK_SIZE_LABEL: str(size_bytes)}
        self.client.volumes.create(name=name, labels=dict(labels), driver_opts=options)
        if size_bytes is not None:
            try:
                self._images().create(name, size_bytes, WORKSPACE_UID)
            except DiskImageError:
                self._remove_volume(name)
                raise
        return True

    def _images(self) -> DiskImages:
        if self.disk_images is None:
            raise DiskImageError("a disk bound needs a command channel to the host (host_runner)")
        return self.disk_images

    def _mount_image(self, attrs: Mapping[str, Any]) -> None:
        """Mount a bounded volume's image again if it is not (after the host rebooted), or
        finish making it when the process that recorded the volume ended first.

        Docker binds a folder inside the mounted image, so no container can have written to a
        volume whose image was never made: completing it loses nothing."""
        labels = attrs.get("Labels") or {}
        if DISK_IMAGE_LABEL not in labels:
            return
        name = str(attrs["Name"])
        size = labels.get(DISK_SIZE_LABEL)
        if size is None:  # recorded before volumes carried their size: made image first
            self._images().ensure_mounted(name)
        else:
            self._images().create(name, int(size), WORKSPACE_UID)

    def mount_volume(self, name: str) -> None:
        """Make a volume usable by a new container: a bounded one's image mounted on its host."""
        try:
            attrs = self.client.volumes.get(name).attrs
        except NotFound as exc:
            raise WorkspaceError(f"volume {name} does not exist") from exc
        try:
            self._mount_image(attrs)
        except DiskImageError as exc:
            raise WorkspaceError(str(exc)) from exc

    def volume_dir(self, name: str) -> str:
        """The host folder holding a volume's files, also while no container mounts it: a
        bounded volume's data folder (mounted first), else the engine's mount point."""
        attrs = self.client.volumes.get(name).attrs
        if DISK_IMAGE_LABEL in (attrs.get("Labels") or {}):
            self._mount_image(attrs)
            return self._images().data_dir(name)
        return str(attrs["Mountpoint"])

    def storage_quota_supported(self) -> bool:
        """Whether this engine's storage driver can limit a container's writable layer."""
        if self._quota_driver is None:
            info = self.client.info()
            driver = str(info.get("Driver", ""))
            status = {str(k): str(v) for k, v in info.get("DriverStatus") or []}
            if driver == "overlay2":
                self._quota_driver = status.get("Backing Filesystem") == "xfs"
            else:
                self._quota_driver = driver in QUOTA_DRIVERS
        return self._quota_driver

    @staticmethod
    def _paper_volume(name: str) -> str:
        return f"{name}-paper"

    def _fill_paper_volume(
        self, volume: str, task_dir: Path, image_id: str, labels: Mapping[str, str]
    ) -> None:
        """Copy the task files into a fresh volume via a helper container that never starts."""
        self._remove_volume(volume)
        self.client.volumes.create(name=volume, labels=dict(labels))
        helper = self.client.containers.create(
            image_id,
            command=["true"],
            user="root",
            network_mode="none",
            labels=dict(labels),
            mounts=[Mount(target=PAPER_DIR, source=volume, type="volume")],
        )
        try:
            if not helper.put_archive(PAPER_DIR, task_tar(task_dir)):
                raise WorkspaceError(f"copying {task_dir} into {volume} failed")
        finally:
            helper.remove(force=True)

    def _remove_volume(self, name: str) -> None:
        """Remove the volume, and its disk image when it has one (the files go with it): the
        image first, the volume (its record) last, so that an interrupted removal is found and
        finished by the next one."""
        try:
            volume = self.client.volumes.get(name)
        except NotFound:
            return
        bounded = DISK_IMAGE_LABEL in (volume.attrs.get("Labels") or {})
        self.remove_helpers(name)  # a long-lived capture helper holds the volume
        if bounded:
            users = self.client.containers.list(all=True, filters={"volume": name})
            if users:
                names = ", ".join(sorted(str(c.name) for c in users))
                raise WorkspaceError(f"volume {name} is still used by the container(s) {names}")
            try:
                self._images().remove(name)
            except DiskImageError as exc:
                raise WorkspaceError(str(exc)) from exc
        with contextlib.suppress(NotFound):
            volume.remove(force=True)

    def remove_helpers(self, volume: str) -> None:
        """Remove the capture helpers of `volume` (`infra.remote_capture`), whoever made them:
        a volume cannot be removed while a container mounts it."""
        selector = {"label": [f"{HELPER_LABEL}={volume}"]}
        for container in self.client.containers.list(all=True, filters=selector):
            with contextlib.suppress(NotFound):
                container.remove(force=True)

    # -- life cycle -------------------------------------------------------------------------

    def _container(self, handle: WorkspaceHandle) -> Container:
        try:
            return self.client.containers.get(handle.name)
        except NotFound as exc:
            raise WorkspaceError(f"workspace {handle.name} has no container") from exc

    def start(self, handle: WorkspaceHandle) -> None:
        """Start the container and make sure /home/submission is a git repository."""
        container = self._container(handle)
        try:
            volume = self.client.volumes.get(handle.submission_volume)
        except NotFound as exc:
            raise WorkspaceError(f"{handle.name} has no submission volume") from exc
        try:
            self._mount_image(volume.attrs)
            container.start()
        except DiskImageError as exc:
            raise WorkspaceError(f"starting {handle.name} failed: {exc}") from exc
        except APIError as exc:
            raise WorkspaceError(f"starting {handle.name} failed: {exc.explanation}") from exc
        result = self.exec(
            handle,
            ["sh", "-c", "test -d .git || git init -q ."],
            workdir=SUBMISSION_DIR,
            timeout_s=60,
        )
        if result.exit_code != 0:
            output = result.output.decode(errors="replace").strip()
            raise WorkspaceError(f"initialising the submission repository failed: {output}")

    def status(self, handle: WorkspaceHandle) -> WorkspaceState:
        try:
            container = self.client.containers.get(handle.name)
        except NotFound:
            return WorkspaceState.MISSING
        state = container.attrs.get("State", {})
        if state.get("OOMKilled"):
            return WorkspaceState.DEAD
        return _STATES.get(str(container.status), WorkspaceState.DEAD)

    def stop(self, handle: WorkspaceHandle) -> None:
        try:
            self._container(handle).stop(timeout=10)
        except APIError as exc:
            raise WorkspaceError(f"stopping {handle.name} failed: {exc.explanation}") from exc

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        """Remove the container and the task copy; the submission volume too unless kept.

        A family's scoring that held GPUs by this workspace ran in a container of its name, in
        a state saved for it under a tag of that name when the attempt's ended state was not
        on the engine (`infra.family_run.scoring_state_tag`): that state is removed too, as
        its scoring would have, had its process not died (it is the workspace's whole file
        system, many GB maybe). A removal that fails raises: the workspace stays live and is
        destroyed again later."""
        try:
            self.client.containers.get(handle.name).remove(force=True)
        except NotFound:
            pass
        except APIError as exc:
            # Removed by someone else at the same moment (the engine's own auto-remove, another
            # process's reconcile): done once it is gone.
            if exc.status_code != 409 or not self._gone_soon(handle.name):
                raise WorkspaceError(f"removing {handle.name} failed: {exc.explanation}") from exc
        scoring_state = scoring_state_tag(handle.name)
        try:  # after its container: an image a container still uses is only untagged
            self.client.images.remove(scoring_state, force=True)
        except NotFound:  # none saved (the usual case: most workspaces score nothing)
            pass
        except APIError as exc:
            raise WorkspaceError(f"removing {scoring_state} failed: {exc.explanation}") from exc
        self._remove_volume(self._paper_volume(handle.name))
        if handle.container_id:  # a family attempt's state saved for its final score, if any
            remove_state(self.client, final_state_tag(handle.container_id))
        if not keep_submission:
            self._remove_volume(handle.submission_volume)

    def _gone_soon(self, name: str, wait_s: float = 30.0) -> bool:
        """Whether the container `name`, being removed, is gone within `wait_s`."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                self.client.containers.get(name)
            except NotFound:
                return True
            time.sleep(0.2)
        return False

    def reconcile(self, live_names: set[str], *, min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
        """Remove this backend's containers whose workspace is not live (and that were created
        at least `min_age_s` ago: see ORPHAN_MIN_AGE_S); return their names.

        Submission volumes are kept: they are the participant's work and may still be needed
        for a final snapshot. The task copies (paper volumes) are removed with the container.
        """
        filters = {"label": [f"{key}={value}" for key, value in self.labels.items()]}
        removed: list[str] = []
        for container in self.client.containers.list(all=True, filters=filters):
            name = container.labels.get(WORKSPACE_LABEL, "")
            if name in live_names:
                continue
            if HELPER_LABEL in container.labels:
                # A volume's helper stays between captures and ends itself once idle (it is
                # auto-removed); a stopped one is removed once no capture can still read it.
                if _stopped_for(container) > HELPER_STOPPED_GRACE_S:
                    with contextlib.suppress(NotFound):
                        container.remove(force=True)
                continue
            if _age(container) < min_age_s:
                continue
            try:
                container.remove(force=True)
            except NotFound:
                continue
            if container.name == name:
                self._remove_volume(self._paper_volume(name))
            removed.append(name)
        return sorted(set(removed))

    # -- exec and files ---------------------------------------------------------------------

    def exec(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        workdir: str | None = None,
        on_output: OutputSink | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run a command, streaming stdout+stderr to `on_output` (from a reader thread).

        The timeout is enforced inside the container by coreutils `timeout`, which signals the
        command's whole process group (TERM, then KILL two seconds later); the client also stops
        waiting EXEC_GRACE_S after it. Output beyond `max_output_bytes` is streamed but not kept.
        """
        if not command:
            raise ValueError("empty command")
        argv = list(command)
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError("timeout_s must be positive")
            argv = ["timeout", "--kill-after=2", f"{timeout_s:.3f}", *argv]
        container = self._container(handle)
        # From before the exec starts: `exec_start` answers once the command already runs, and on
        # a loaded engine that answer can come after much of the timeout has passed, so a command
        # `timeout` stopped would read as its own exit 124, not as timed out.
        started = time.monotonic()
        try:
            exec_id = self.api.exec_create(
                container.id, argv, stdout=True, stderr=True, user=user or "", workdir=workdir
            )["Id"]
            connection = ExecConnection(self.api, exec_id)
        except APIError as exc:
            raise WorkspaceError(f"exec in {handle.name} failed: {exc.explanation}") from exc
        kept = bytearray()
        state: dict[str, Any] = {"truncated": False, "error": None}
        lock = threading.Lock()

        def pump() -> None:
            try:
                for _, chunk in connection.frames():
                    if on_output is not None:
                        on_output(chunk)
                    with lock:
                        room = max_output_bytes - len(kept)
                        if len(chunk) > room:
                            state["truncated"] = True
                        kept.extend(chunk[: max(room, 0)])
            except Exception as exc:  # surfaced to the caller below
                state["error"] = exc
            finally:
                connection.close()

        reader = threading.Thread(target=pump, name=f"exec-{handle.name}", daemon=True)
        reader.start()
        reader.join(None if timeout_s is None else timeout_s + EXEC_GRACE_S)
        duration = time.monotonic() - started
        with lock:
            output, truncated = bytes(kept), bool(state["truncated"])
        if reader.is_alive():
            connection.close()  # the reader ends; the command, past its timeout, is killed
            return ExecResult(
                None, output, timed_out=True, duration_s=duration, truncated=truncated
            )
        if state["error"] is not None:
            raise WorkspaceError(f"exec in {handle.name} lost its stream: {state['error']}")
        try:
            exit_code = self.api.exec_inspect(exec_id).get("ExitCode")
        except APIError as exc:  # the workspace was removed while the command ran
            raise WorkspaceError(f"exec in {handle.name} lost: {exc.explanation}") from exc
        timed_out = timeout_s is not None and exit_code in (124, 137) and duration >= timeout_s
        return ExecResult(
            exit_code=None if timed_out else exit_code,
            output=output,
            timed_out=timed_out,
            duration_s=duration,
            truncated=truncated,
        )

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: Archive) -> None:
        """Unpack a tar at `path` (which must exist); entries keep the tar's owners and modes. A
        file is sent as the request's body in blocks (the engine's HTTP client streams it)."""
        try:
            ok = self._container(handle).put_archive(path, archive)
        except APIError as exc:
            raise WorkspaceError(
                f"copying into {handle.name}:{path} failed: {exc.explanation}"
            ) from exc
        if not ok:
            raise WorkspaceError(f"copying into {handle.name}:{path} failed")

    def get_archive(self, handle: WorkspaceHandle, path: str) -> bytes:
        """A tar of `path`; works on a stopped container too (snapshots of a dead workspace).

        Whole, in memory: for small paths. Captures read `iter_archive` instead."""
        return b"".join(self.iter_archive(handle, path))

    def iter_archive(self, handle: WorkspaceHandle, path: str) -> Iterator[bytes]:
        """The tar of `path` as the engine sends it, chunk by chunk: a workspace of any size
        costs one chunk of memory here. A stream that breaks raises WorkspaceError."""
        try:
            chunks, _ = self._container(handle).get_archive(path, chunk_size=ARCHIVE_CHUNK)
            yield from chunks
        except APIError as exc:
            raise WorkspaceError(
                f"copying {handle.name}:{path} out failed: {exc.explanation}"
            ) from exc
        except Exception as exc:  # docker, urllib3 and socket errors share no base class
            raise WorkspaceError(f"copying {handle.name}:{path} out broke off: {exc}") from exc


def _age(container: Container) -> float:
    """Seconds since the container was created (a long time where the engine does not say)."""
    return _seconds_since(str(container.attrs.get("Created") or ""))


def _seconds_since(timestamp: str) -> float:
    """Seconds since an engine timestamp (RFC 3339 with nanoseconds); inf if unreadable."""
    micro = re.sub(r"(\.\d{6})\d*", r"\1", timestamp)
    try:
        then = datetime.fromisoformat(micro.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (datetime.now(UTC) - then).total_seconds()


def _stopped_for(container: Container) -> float:
    """Seconds since the container stopped (0 while it runs; never-started ones: a long time)."""
    state = container.attrs.get("State") or {}
    if state.get("Running"):
        return 0.0
    return _seconds_since(str(state.get("FinishedAt") or ""))
