"""The egress gateway of a Docker engine: every `open` or `blacklist` workspace goes out through
the filtering proxy, so each of its requests is decided by the study's policy and logged.

A gateway serves one engine: an internal bridge network (no route out) whose gateway address the
proxy listens on. On this machine's engine (`unix://`) the proxy is
`infra.egress.proxy.EgressProxy`, a mitmdump child process; on an `ssh://` engine it is the same
mitmdump and addon in a container on that host (`infra.egress.container_proxy.ContainerProxy`,
host network, so it binds the same kind of address), its policies, CA and event log kept in the
same state dir here, so registering, trusting the CA and ingesting events are the same code for
both. A process keeps one gateway per Docker host (`for_host`), and a workspace is routed through
the gateway of the host placement puts it on (`router`). The host's firewall
(`infra.egress.firewall`, iptables: here as root, or on a remote engine's host through a helper
container, `infra.egress.engine_host`) admits nothing from the network but the proxy's port;
without it a container would reach any host service on a non-loopback address directly, so the
gateway refuses to run without it. The network keeps its workspaces apart (icc off,
`infra.egress.network`), and the proxy refuses the network's subnet as a destination, so that no
workspace reaches another through it either.

What a restart needs survives one: the policies (with each workspace's token) live in the proxy's
state dir and `EgressProxy.start` keeps them; the listening address is kept in `listen.json`, so a
workspace's proxy URL, stored with the workspace (`Workspace.env`), stays valid across portal
restarts. The policy file is the state shared between processes: a CLI launch registers its
workspace there while the portal's proxy runs (a proxy already answering on the kept address is
used, not started twice; a CLI launch with no portal running starts one for the command's
duration only, and the portal's egress job brings it back). The proxy is this process's child
(on a remote engine: its container, whose last events `stop` pulls before removing it):
`shutdown` (called when the scheduler shuts down, and at exit) stops it; the periodic `ingest_job`
restarts it when it is not answering (a portal restart, a crash), records its events as
`EgressEvent` rows, and drops the policies of workspaces another process destroyed.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import DockerException
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.config import Settings
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.models import (
    Attempt,
    EgressPolicy,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.tasks import tasks
from baseline.workspaces import egress
from baseline.workspaces.backends import DEPLOYMENT_LABEL, deployment_labels
from infra.blobs import BlobStore
from infra.egress import firewall, setup
from infra.egress.container_proxy import ContainerProxy
from infra.egress.engine_host import firewall_for
from infra.egress.network import ensure_network, subnets_of
from infra.egress.proxy import EgressProxy, EgressProxyError, find_mitmdump
from infra.egress.rules import load_config
from infra.workspace import WorkspaceBackend, WorkspaceHandle

log = logging.getLogger(__name__)

LOCAL_ENGINE = "unix:///var/run/docker.sock"
NETWORK = "baseline-egress"  # one per engine, shared by its deployments (`firewall_owner`)
NETWORK_LABELS = {"baseline.component": "egress"}
PROXIED = (EgressPolicy.OPEN, EgressPolicy.BLACKLIST)
REMOTE_FIREWALL_RECHECK_S = 300.0


class EgressUnavailable(InvalidInput):
    """The proxy cannot be had here (mitmdump missing, no local host, engine down)."""


@dataclass(frozen=True)
class Route:
    """Where a workspace's traffic goes: its Docker network and the environment that uses it."""

    network: str
    env: dict[str, str]


class EgressGateway:
    """The proxy and its internal network on one Docker engine, state under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        *,
        docker_url: str = LOCAL_ENGINE,
        network: str = NETWORK,
        labels: Mapping[str, str] | None = None,
        allow_private: bool = False,
        upstream_ca: Path | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.docker_url = docker_url
        self.network = network
        self.owner = firewall_owner()
        self.labels = dict(labels if labels is not None else NETWORK_LABELS)
        self.allow_private = allow_private
        self.upstream_ca = upstream_ca
        self._proxy: EgressProxy | None = None  # the process this gateway started
        self._address: tuple[str, int] | None = None
        self._firewalled: tuple[int, float] | None = None  # port, when last found in place
        self._lock = threading.Lock()

    @property
    def listen_path(self) -> Path:
        return self.state_dir / "listen.json"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "events.jsonl"

    @property
    def local(self) -> bool:
        """Whether the engine is this machine's (the proxy a process) or a remote host's."""
        return self.docker_url.startswith("unix://")

    @property
    def container_name(self) -> str:
        """The proxy's container on a remote engine: one per network and deployment."""
        if self.owner == firewall.DEFAULT_OWNER:
            return f"{self.network}-proxy"
        return f"{self.network}-proxy-{self.owner}"

    def _client(self) -> docker.DockerClient:
        try:
            return docker.DockerClient(base_url=self.docker_url, use_ssh_client=False, timeout=120)
        except (DockerException, OSError) as exc:  # OSError: an SSH host not reached
            raise EgressUnavailable(
                f"the egress proxy needs the Docker Engine at {self.docker_url}: {exc}"
            ) from None

    def _proxy_for(
        self, client: docker.DockerClient | None, host: str, port: int, subnets: list[str]
    ) -> EgressProxy:
        """The proxy of this engine: a process here, or a container on the remote host."""
        if client is None:
            return EgressProxy(
                self.state_dir,
                listen_host=host,
                port=port,
                upstream_ca=self.upstream_ca,
                allow_private=self.allow_private,
                deny_networks=subnets,
            )
        return ContainerProxy(
            self.state_dir,
            client,
            name=self.container_name,
            listen_host=host,
            port=port,
            labels=self.labels,
            upstream_ca=self.upstream_ca,
            allow_private=self.allow_private,
            deny_networks=subnets,
        )

    @contextmanager
    def _store(self) -> Iterator[EgressProxy]:
        """The proxy's policy store (file-based, usable whether or not the proxy runs); on a
        remote engine its saves are also copied into the running container."""
        if self.local:
            yield EgressProxy(self.state_dir)
            return
        if self._proxy is not None:
            yield self._proxy
            return
        client = self._client()
        try:
            host, port = self._kept_address()
            yield self._proxy_for(client, host, port, [])
        finally:
            client.close()

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Serialise policy edits across processes (the portal and a CLI launch)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / "policies.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- the proxy process --------------------------------------------------------------------

    def ensure_running(self) -> tuple[str, int]:
        """The proxy's address, starting it (and the network) unless it already answers, with the
        host firewalled so that the network's containers reach nothing of it but the proxy."""
        address = self._ensure_proxy()
        self._restrict_to_proxy(address[1])
        return address

    def _ensure_proxy(self) -> tuple[str, int]:
        with self._lock:
            try:
                mitmdump = find_mitmdump()
            except EgressProxyError as exc:
                raise EgressUnavailable(f"the egress proxy is unavailable: {exc}") from None
            gateway_ip, subnets = self._ensure_network()
            port = self._kept_port(gateway_ip)
            if self._address == (gateway_ip, port) and self._answers(gateway_ip, port):
                return self._address
            if self._proxy is None and port and self._answers(gateway_ip, port):
                self._address = (gateway_ip, port)  # another process of this home runs it
                return self._address
            self._stop_locked()
            proxy = self._proxy_for(
                None if self.local else self._client(), gateway_ip, port, subnets
            )
            proxy.mitmdump = mitmdump
            try:
                proxy.start()
            except EgressProxyError as exc:
                self._close(proxy)
                raise EgressUnavailable(f"the egress proxy did not start: {exc}") from None
            self._proxy, self._address = proxy, (gateway_ip, proxy.port)
            self.listen_path.write_text(json.dumps({"host": gateway_ip, "port": proxy.port}))
            log.info("egress proxy listening on %s:%s", gateway_ip, proxy.port)
            return self._address

    def _answers(self, host: str, port: int) -> bool:
        """Whether a proxy answers there: a socket here; on a remote engine, its container."""
        if self.local:
            return _answers(host, port)
        if self._proxy is not None and (self._proxy.listen_host, self._proxy.port) == (host, port):
            return self._proxy.answers()  # its own client: no new SSH connection
        client = self._client()
        try:
            proxy = self._proxy_for(client, host, port, [])
            return proxy.answers()
        finally:
            client.close()

    def _ensure_network(self) -> tuple[str, list[str]]:
        """The network's gateway (the proxy's address) and its subnets, which the proxy refuses
        as destinations: through it, one workspace would otherwise reach another."""
        client = self._client()
        try:
            gateway = ensure_network(client, self.network, self.labels)
            return gateway, subnets_of(client.networks.get(self.network).attrs)
        except (DockerException, ValueError) as exc:
            raise EgressUnavailable(f"the egress network {self.network}: {exc}") from None
        finally:
            client.close()

    def _restrict_to_proxy(self, port: int) -> None:
        """Without these rules a container reaches any host service on a non-loopback address.

        Checked on every call here (iptables answers in milliseconds); on a remote engine each
        check is a helper container (seconds over SSH), so a check that found the rules in place
        holds for `REMOTE_FIREWALL_RECHECK_S` unless the port changed."""
        now = time.monotonic()
        if not self.local and self._firewalled is not None:
            checked_port, checked_at = self._firewalled
            if checked_port == port and now - checked_at < REMOTE_FIREWALL_RECHECK_S:
                return
        client = self._client()
        try:
            rules = firewall_for(self.docker_url, client, self.labels)
            rules.restrict_to_proxy(firewall.bridge_of(client, self.network), port, self.owner)
            self._firewalled = (port, now)
        except (DockerException, firewall.FirewallError) as exc:
            raise EgressUnavailable(f"the egress network {self.network}: {exc}") from None
        finally:
            client.close()

    def _kept_address(self) -> tuple[str, int]:
        """The address of the last start ("", 0: none yet)."""
        if not self.listen_path.exists():
            return "", 0
        kept = json.loads(self.listen_path.read_text())
        return str(kept.get("host", "")), int(kept.get("port", 0))

    def _kept_port(self, gateway_ip: str) -> int:
        """The port of the last start on this address (0: pick one), so proxy URLs stay valid."""
        if not self.listen_path.exists():
            return 0
        kept = json.loads(self.listen_path.read_text())
        return int(kept["port"]) if kept.get("host") == gateway_ip else 0

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._proxy is not None:
            try:
                # A container proxy's stop pulls its last events: not while `ingest` pulls.
                with self._file_lock() if not self.local else nullcontext():
                    self._proxy.stop()
            finally:
                self._close(self._proxy)
        self._proxy, self._address = None, None

    @staticmethod
    def _close(proxy: EgressProxy) -> None:
        if isinstance(proxy, ContainerProxy):
            proxy.client.close()

    # -- workspaces ---------------------------------------------------------------------------

    def route(self, session: Session, blobs: BlobStore, attempt: Attempt, workspace: str) -> Route:
        """Register the attempt's workspace with the study's policy; its network and env."""
        blacklist = tasks.task_blacklist(blobs, attempt.task)
        return self.register(workspace, egress.mode_for(attempt.study), "\n".join(blacklist))

    def register(self, workspace: str, mode: str, blacklist_text: str = "") -> Route:
        host, port = self.ensure_running()
        with self._file_lock(), self._store() as store:
            credentials = store.register(workspace, mode, blacklist_text)
        return Route(self.network, setup.environment(credentials.url(host, port)))

    def unregister(self, workspace: str) -> None:
        """Revoke the workspace's credentials. The policy file here is what counts: it changes
        even when a remote host does not answer (then this raises, and `ingest` gives that
        host's proxy the file once it answers again)."""
        with self._file_lock():
            EgressProxy(self.state_dir).unregister(workspace)
            if not self.local:
                with self._store() as store:
                    _publish_if_stale(store)

    def install(self, backend: WorkspaceBackend, handle: WorkspaceHandle) -> None:
        """Make a new container trust the proxy's CA (it decrypts HTTPS to match paths)."""
        ca = EgressProxy(self.state_dir).ca_path
        if not ca.exists():
            self.ensure_running()
        setup.install(backend, handle, ca.read_bytes())

    def prune(self, session: Session) -> list[str]:
        """Drop the policies of destroyed workspaces (destroyed by another process)."""
        if not EgressProxy(self.state_dir).config_path.exists():
            return []
        with self._file_lock(), self._store() as policies:
            names = list(load_config(policies.config_path.read_text()))
            gone = list(
                session.scalars(
                    select(Workspace.name).where(
                        Workspace.name.in_(names), Workspace.status == WorkspaceStatus.DESTROYED
                    )
                )
            )
            for name in gone:
                policies.unregister(name)
        return gone

    def ingest(self, ctx: Context) -> egress.IngestReport:
        """Record the proxy's new events as `EgressEvent` rows, then remember the offset (a remote
        proxy's events are first pulled here, and the policy file published there if it missed a
        change; a host that does not answer keeps both for later)."""
        if not self.local:
            try:
                with self._file_lock(), self._store() as store:
                    store.pull_events()
                    _publish_if_stale(store)  # a revocation that did not reach it
            except (EgressProxyError, EgressUnavailable, DockerException) as exc:
                log.warning("egress events of %s not pulled: %s", self.docker_url, exc)
        with ctx.session() as session:
            report = egress.ingest(session, self.log_path)
        egress.commit_offset(self.log_path, report)
        for problem in report.invalid:
            log.warning("egress log %s: %s", self.log_path, problem)
        with ctx.session() as session:  # after the events are kept: a lost host fails only this
            self.prune(session)
        return report


def _publish_if_stale(store: EgressProxy) -> None:
    """Give a remote proxy the policy file here unless it has it already."""
    if isinstance(store, ContainerProxy) and store.stale():
        store.publish()


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


# -- the process's gateways, one per Docker host ---------------------------------------------

Router = Callable[[Session, Workspace, Host], Route | None]

_gateways: dict[str, EgressGateway] = {}  # by the host's docker_url
_gateways_lock = threading.Lock()


def state_dir(settings: Settings, docker_url: str = LOCAL_ENGINE) -> Path:
    """A gateway's state (policies, CA, events, address). The local engine's stays where it was
    before there were several, so existing installs keep their workspaces' proxy URLs; another
    host's is a folder named after its URL under `hosts/`."""
    root = settings.home / "egress"
    if docker_url == LOCAL_ENGINE:
        return root
    return root / "hosts" / re.sub(r"[^A-Za-z0-9.-]+", "_", docker_url)


def firewall_owner() -> str:
    """Whose proxy rule this process installs on a shared egress bridge: its deployment
    (`BASELINE_DEPLOYMENT`). Several deployments on one engine share the bridge, each with its
    proxy on its own port: a chain holding one port only cut the others' workspaces off their
    proxy each time one deployment refreshed it."""
    deployment = deployment_labels()[DEPLOYMENT_LABEL]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", deployment)[:200] or firewall.DEFAULT_OWNER


def for_host(settings: Settings, docker_url: str) -> EgressGateway:
    """This process's gateway for a host of an installation's home, made on first use."""
    with _gateways_lock:
        gateway = _gateways.get(docker_url)
        if gateway is None or gateway.state_dir != state_dir(settings, docker_url):
            if gateway is not None:
                gateway.stop()
            gateway = _gateways[docker_url] = EgressGateway(
                state_dir(settings, docker_url), docker_url=docker_url
            )
        return gateway


def activate(docker_url: str, gateway: EgressGateway | None) -> EgressGateway | None:
    """Use `gateway` for a host in this process (tests: a labelled network); returns the
    previous one."""
    with _gateways_lock:
        previous = _gateways.pop(docker_url, None)
        if gateway is not None:
            _gateways[docker_url] = gateway
        return previous


def shutdown() -> None:
    """Stop the proxies this process started (scheduler shutdown, process exit)."""
    with _gateways_lock:
        gateways = list(_gateways.values())
    for gateway in gateways:
        gateway.stop()


atexit.register(shutdown)


def router(ctx: Context) -> Router:
    """Routes for `workspaces.place`: an attempt's workspace of an `open` or `blacklist` study
    goes through the gateway of the host it is being placed on, which only placement knows
    (None: the workspace keeps the network it was requested with)."""
    blobs = BlobStore(ctx.settings.blob_dir)

    def route_on(session: Session, workspace: Workspace, host: Host) -> Route | None:
        attempt = session.get(Attempt, workspace.attempt_id) if workspace.attempt_id else None
        if (
            attempt is None
            or workspace.purpose is not WorkspacePurpose.ATTEMPT
            or attempt.study.egress_policy not in PROXIED
        ):
            return None
        gateway = for_host(ctx.settings, host.docker_url)
        return gateway.route(session, blobs, attempt, workspace.name)

    return route_on


def proxied(workspace: Workspace) -> bool:
    """Whether the workspace reaches out through the gateway (its env holds a proxy URL)."""
    return bool(workspace.env) and "HTTPS_PROXY" in (workspace.env or {})


def ensure_attempt_proxy(ctx: Context, attempt_id: int) -> None:
    """Make the proxy of the attempt's running, proxied workspace answer, started in this process
    when none does; raises `EgressUnavailable` when it cannot be had.

    Called before an attempt's clock starts and before a driver's first step: the proxy that
    routed the workspace may have been the child of a process that has ended since (a CLI
    `attempt launch` with no portal running), and the portal's egress job brings it back only at
    its next round, if a portal runs at all. Until then every request of the workspace failed to
    connect and left no egress evidence. A driver's proxy lives as long as the driver."""
    with ctx.session() as session:
        rows = session.execute(
            select(Workspace, Host.docker_url)
            .join(Host, Host.id == Workspace.host_id)
            .where(
                Workspace.attempt_id == attempt_id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status == WorkspaceStatus.RUNNING,
            )
        ).all()
        urls = sorted({url for workspace, url in rows if proxied(workspace)})
    for url in urls:
        for_host(ctx.settings, url).ensure_running()


def after_create(
    workspace: Workspace, host: Host, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> None:
    """Called once a proxied workspace's container was (re)created and started on `host`."""
    if not proxied(workspace):
        return
    gateway = _gateways.get(host.docker_url)
    if gateway is None:
        raise EgressUnavailable(
            f"workspace {workspace.name} uses the egress proxy of {host.name}, which this "
            "process has not started yet (the scheduler's egress job starts it)"
        )
    gateway.install(backend, handle)


def after_destroy(workspace: Workspace, host: Host | None) -> None:
    """Revoke a destroyed workspace's proxy credentials on its host's gateway (else `prune`
    does it later). The policy file here is what counts: a remote host that does not answer
    (a lost host) gets it from the egress job once it answers again, so its failure is only
    logged."""
    gateway = _gateways.get(host.docker_url) if host is not None else None
    if gateway is None or not proxied(workspace):
        return
    try:
        gateway.unregister(workspace.name)
    except (EgressProxyError, EgressUnavailable, DockerException, OSError) as exc:
        if gateway.local:
            raise
        log.warning(
            "egress policy of %s not sent to %s: %s", workspace.name, gateway.docker_url, exc
        )


def ingest_job(ctx: Context) -> dict[str, egress.IngestReport] | None:
    """The scheduler's periodic job: keep the proxy of each host with proxied workspaces up (a
    portal restart, a crash) and record every gateway's events, the local one's always (a CLI
    launch's proxy may have left some). A host that does not answer is logged and skipped: the
    others' proxies and events are still seen to."""
    if not state_dir(ctx.settings).exists():
        return None  # no workspace of this installation ever used the proxy
    with ctx.session() as session:
        rows = session.execute(
            select(Workspace, Host.docker_url)
            .join(Host, Host.id == Workspace.host_id)
            .where(Workspace.status != WorkspaceStatus.DESTROYED)
        ).all()
        in_use = {url for workspace, url in rows if proxied(workspace)}
    reports: dict[str, egress.IngestReport] = {}
    for url in sorted({LOCAL_ENGINE} | in_use | set(_gateways)):
        gateway = for_host(ctx.settings, url)
        if url in in_use:
            try:
                gateway.ensure_running()
            except (EgressUnavailable, DockerException, OSError) as exc:
                log.error("egress proxy of %s: %s", url, exc)
        if gateway.state_dir.exists():
            try:
                reports[url] = gateway.ingest(ctx)
            except (EgressProxyError, EgressUnavailable, DockerException, OSError) as exc:
                log.error("egress events of %s: %s", url, exc)
    return reports
