"""The egress proxy on the host of an `ssh://` engine: the same mitmdump and addon, in a container.

Workspaces on an internal network reach nothing but their host, so the proxy must run on that
host, listening on the network's gateway address as the local one does. A container with the
host's network namespace (`network_mode="host"`) binds exactly that address; its image
(`infra.egress.proxy_image`) holds the mitmproxy version of the local egress venv.

This machine stays the source of truth, as for the local proxy: the policy store, the proxy's CA
and the event log live in the same state dir here, so the domain layer ingests remote events
exactly like local ones, and a recreated container keeps the CA workspaces already trust.

- Policies: every save is copied into the container under a temporary name and renamed there
  (`put_archive`, then `mv`), so the addon never reads half a file; `touch` first, since a tar
  carries whole-second mtimes and the addon re-reads on a changed mtime. What the container was
  last given is recorded here (`published.json`: the container and the file's digest), so a save
  that could not reach it (its host lost, the proxy down and later brought back by its restart
  policy with the old file) is seen as `stale` and published again (the gateway's egress job).
- CA: copied in before the first start when this machine has one, copied back after it otherwise.
- Events: `pull_events` appends what the container's log gained since the last pull (up to its
  last complete line) to the local log; the position is kept with the container's id, so a new
  container is read from its start. `stop` pulls first, then removes the container.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from infra.egress.proxy import (
    CONFDIR,
    EVENTS,
    POLICIES,
    PORT_TRIES,
    PORTS,
    EgressProxy,
    EgressProxyError,
    PortTaken,
)
from infra.egress.proxy_image import ADDON_IN_IMAGE, ENTRYPOINT, ensure_proxy_image
from infra.image_build import ImageBuildError

STATE = PurePosixPath("/var/lib/baseline-egress")
UPSTREAM_CA = STATE / "upstream-ca.pem"
PROXY_LABELS = {"baseline.component": "egress-proxy"}
# Exit 0 when something accepts on (host, port): run inside the container, on the host's network.
PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close()\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
)


class ContainerProxy(EgressProxy):
    """The proxy of one remote engine: container `name`, state under `state_dir` here."""

    def __init__(
        self,
        state_dir: Path,
        client: docker.DockerClient,
        *,
        name: str,
        listen_host: str,
        port: int = 0,
        labels: Mapping[str, str] | None = None,
        upstream_ca: Path | None = None,
        allow_private: bool = False,
        deny_networks: Sequence[str] = (),
    ) -> None:
        super().__init__(
            state_dir,
            listen_host=listen_host,
            port=port,
            upstream_ca=upstream_ca,
            allow_private=allow_private,
            deny_networks=deny_networks,
        )
        self.client = client
        self.name = name
        self.labels = {**PROXY_LABELS, **(labels or {})}
        self.pull_path = state_dir / "remote-events.json"
        self.published_path = state_dir / "published.json"

    # -- the container ------------------------------------------------------------------------

    def _container(self) -> Container | None:
        try:
            return self.client.containers.get(self.name)
        except NotFound:
            return None

    def _running(self) -> Container | None:
        container = self._container()
        return container if container is not None and container.status == "running" else None

    def command(self) -> list[str]:
        upstream = str(UPSTREAM_CA) if self.upstream_ca is not None else None
        return [*ENTRYPOINT, *self.arguments(STATE, ADDON_IN_IMAGE, upstream)]

    def answers(self) -> bool:
        """The container runs and its address accepts (probed from the container itself: the
        gateway address is the remote host's, unreachable from here)."""
        container = self._running()
        if container is None or not self.port:
            return False
        probe = ["python3", "-c", PROBE, self.listen_host, str(self.port)]
        try:
            return container.exec_run(probe).exit_code == 0
        except DockerException:
            return False

    def start(self, timeout_s: float = 60.0) -> None:
        """(Re)create the container on the kept port (or a drawn one) and wait until it listens."""
        try:
            image = ensure_proxy_image(self.client, self.mitmdump).tag
        except (ImageBuildError, DockerException) as exc:
            raise EgressProxyError(f"the egress proxy image: {exc}") from exc
        if not self.config_path.exists():
            EgressProxy._save(self, {})  # the local store only: no container yet
        self.log_path.touch()
        kept = self.port
        try:
            for _ in range(1 if kept else PORT_TRIES):
                self.port = kept or random.randrange(*PORTS)
                try:
                    self._start_once(image, timeout_s)
                    return
                except PortTaken:
                    continue
            raise EgressProxyError(f"no free port for the egress proxy on {self.listen_host}")
        except EgressProxyError:
            self._remove()  # an exited container would be left behind otherwise
            raise

    def _start_once(self, image: str, timeout_s: float) -> None:
        self._remove()
        try:
            container = self.client.containers.create(
                image,
                self.command(),
                name=self.name,
                network_mode="host",
                labels={**self.labels, "baseline.egress-port": str(self.port)},
                restart_policy={"Name": "unless-stopped"},
            )
            policies = self.config_path.read_bytes()
            container.put_archive(str(STATE.parent), self._state_archive(policies))
            container.start()
        except DockerException as exc:
            raise EgressProxyError(f"the egress proxy container {self.name}: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            container.reload()
            if container.status in ("exited", "dead"):
                logs = container.logs().decode(errors="replace")
                if "address already in use" in logs.lower():
                    raise PortTaken(logs)
                raise EgressProxyError(f"the egress proxy container exited: {_tail(logs)}")
            if self.answers() and self._fetch_ca():
                self._record_published(container, policies)
                return
            time.sleep(0.5)
        logs = container.logs().decode(errors="replace")
        self._remove()
        raise EgressProxyError(f"the egress proxy did not listen within {timeout_s:.0f}s: {logs}")

    def _state_archive(self, policies: bytes) -> bytes:
        """The container's state dir: the policies, the CA kept here (if any), the upstream CA."""
        files = {POLICIES: policies, EVENTS: b""}
        if self.ca_path.exists():
            files.update(
                {f"{CONFDIR}/{path.name}": path.read_bytes() for path in self.confdir.iterdir()}
            )
        if self.upstream_ca is not None:
            files[UPSTREAM_CA.name] = self.upstream_ca.read_bytes()
        return _tar({f"{STATE.name}/{name}": data for name, data in files.items()})

    def _fetch_ca(self) -> bool:
        """Copy the container's CA files here unless this machine has them; whether it has."""
        if self.ca_path.exists():
            return True
        container = self._running()
        if container is None:
            return False
        try:
            stream, _ = container.get_archive(str(STATE / CONFDIR))
        except NotFound:
            return False
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            members = {PurePosixPath(m.name).name: m for m in tar.getmembers() if m.isfile()}
            if self.ca_path.name not in members:
                return False
            self.confdir.mkdir(parents=True, exist_ok=True)
            for name, member in members.items():
                extracted = tar.extractfile(member)
                if extracted is not None:
                    (self.confdir / name).write_bytes(extracted.read())
        return True

    def publish(self) -> None:
        """Copy the saved policies into the running container, atomically (see the module)."""
        container = self._running()
        if container is None:
            return  # `start` copies them in
        staged = f"{POLICIES}.tmp"
        policies = self.config_path.read_bytes()
        try:
            container.put_archive(str(STATE), _tar({staged: policies}))
            moved = container.exec_run(
                ["sh", "-c", f"touch {staged} && mv -f {staged} {POLICIES}"], workdir=str(STATE)
            )
        except DockerException as exc:
            raise EgressProxyError(f"copying the policies into {self.name}: {exc}") from exc
        if moved.exit_code != 0:
            raise EgressProxyError(f"installing the policies in {self.name}: {moved.output!r}")
        self._record_published(container, policies)

    def stale(self) -> bool:
        """Whether the container may hold other policies than the file here (never given them,
        or it is not the container that was)."""
        if not self.published_path.exists() or not self.config_path.exists():
            return True
        container = self._container()
        kept = json.loads(self.published_path.read_text())
        return (
            container is None
            or kept.get("container") != container.id
            or kept.get("sha256") != _digest(self.config_path.read_bytes())
        )

    def _record_published(self, container: Container, policies: bytes) -> None:
        self.published_path.write_text(
            json.dumps({"container": container.id, "sha256": _digest(policies)})
        )

    # -- events -------------------------------------------------------------------------------

    def pull_events(self) -> None:
        """Append the container's new complete event lines to the local log."""
        container = self._container()
        if container is None:
            return
        kept_id, kept_offset = self._pulled()
        offset = kept_offset if kept_id == container.id else 0
        new = self._events_after(container, offset)
        complete = new[: new.rfind(b"\n") + 1]
        if complete:
            with self.log_path.open("ab") as log:
                log.write(complete)
        self.pull_path.write_text(
            json.dumps({"container": container.id, "offset": offset + len(complete)})
        )

    def _events_after(self, container: Container, offset: int) -> bytes:
        """The container's event log from `offset`: read in place while it runs; copied out
        whole once it stopped (a crashed or stopped proxy, whose last events `stop` must keep
        before removing it; exec needs a running container)."""
        path = str(STATE / EVENTS)
        try:
            if container.status == "running":
                read = container.exec_run(["tail", "-c", f"+{offset + 1}", path])
                if read.exit_code != 0:
                    raise EgressProxyError(f"reading the events of {self.name}: {read.output!r}")
                return bytes(read.output)
            stream, _ = container.get_archive(path)
        except NotFound:
            return b""  # never written: no request yet
        except DockerException as exc:
            raise EgressProxyError(f"reading the events of {self.name}: {exc}") from exc
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            return member.read()[offset:] if member is not None else b""

    def _pulled(self) -> tuple[str, int]:
        """The container read last and how far (its log restarts with a new container)."""
        if not self.pull_path.exists():
            return "", 0
        kept = json.loads(self.pull_path.read_text())
        return str(kept["container"]), int(kept["offset"])

    def stop(self) -> None:
        """Pull the last events, then remove the container (the process that started it ends)."""
        if self._container() is None:
            return
        self.pull_events()
        self._remove()

    def _remove(self) -> None:
        container = self._container()
        if container is not None:
            with contextlib.suppress(NotFound):
                container.remove(force=True)


def _tar(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    now = int(time.time())
    folders = sorted({str(p) for name in files for p in PurePosixPath(name).parents} - {"."})
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, now
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tail(text: str, lines: int = 10) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
