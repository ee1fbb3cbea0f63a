"""Run the egress proxy (mitmdump with our addon) and keep its per-workspace policies.

One proxy serves every workspace of a host; a workspace is told apart by the credentials of its
proxy URL, issued by `register`. `EgressProxy` is the proxy of this machine's engine, a child
process; `infra.egress.container_proxy.ContainerProxy` is the same proxy on an `ssh://` engine's
host, in a container, with the same policy store and event log kept here (its hooks `publish`,
`answers` and `pull_events` are where the two differ). The policy file is rewritten atomically
and the addon re-reads it when it changes, so registering a workspace needs no restart. mitmdump
runs from the proxy's own venv (its pinned dependencies clash with the portal's):
`BASELINE_MITMDUMP` or the venv that `scripts/services/25-egress.sh` makes.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from infra.egress.rules import WorkspacePolicy, dump_config, load_config, parse_blacklist

ADDON = Path(__file__).resolve().parent / "addon.py"
DEFAULT_MITMDUMP = "/opt/baseline-egress-venv/bin/mitmdump"
CA_FILE = "mitmproxy-ca-cert.pem"
CONFDIR, POLICIES, EVENTS = "mitmproxy", "policies.json", "events.jsonl"
# Where a proxy's port is drawn when none was kept: below the kernel's ephemeral range
# (32768-60999 by default), from which every outgoing connection takes its local port; a port
# drawn there can be taken by a connection between the draw and the proxy's bind.
PORTS = (20000, 32768)
PORT_TRIES = 5


class EgressProxyError(RuntimeError):
    """The proxy could not be found or started; the message says what to do."""


def find_mitmdump() -> str:
    """mitmdump's path: $BASELINE_MITMDUMP, the egress venv, or PATH; an error if none."""
    for candidate in (os.environ.get("BASELINE_MITMDUMP"), DEFAULT_MITMDUMP):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mitmdump")
    if found:
        return found
    raise EgressProxyError(
        "mitmdump not found: run scripts/services/25-egress.sh or set BASELINE_MITMDUMP"
    )


@dataclass(frozen=True)
class ProxyCredentials:
    workspace: str
    token: str

    def url(self, host: str, port: int) -> str:
        """The proxy URL a workspace uses (HTTP_PROXY / HTTPS_PROXY)."""
        return f"http://{self.workspace}:{self.token}@{host}:{port}"


class EgressProxy:
    """A mitmdump process listening on `listen_host:port`, its state under `state_dir`."""

    def __init__(
        self,
        state_dir: Path,
        *,
        listen_host: str = "127.0.0.1",
        port: int = 0,
        upstream_ca: Path | None = None,
        allow_private: bool = False,
        deny_networks: Sequence[str] = (),
        mitmdump: str | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.listen_host = listen_host
        self.port = port
        self.upstream_ca = upstream_ca
        self.allow_private = allow_private
        self.deny_networks = tuple(deny_networks)  # CIDRs no workspace may reach through it
        self.mitmdump = mitmdump
        self.confdir = state_dir / CONFDIR
        self.config_path = state_dir / POLICIES
        self.log_path = state_dir / EVENTS
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- policies ---------------------------------------------------------------------------

    def _policies(self) -> dict[str, WorkspacePolicy]:
        if not self.config_path.exists():
            return {}
        return load_config(self.config_path.read_text())

    def _save(self, policies: dict[str, WorkspacePolicy]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(dump_config(policies))
        os.replace(tmp, self.config_path)
        self.publish()

    def publish(self) -> None:
        """Make the running proxy see the saved policies: here it reads the file itself."""

    def register(self, workspace: str, mode: str, blacklist_text: str = "") -> ProxyCredentials:
        """Give a workspace its policy and fresh credentials (replacing earlier ones)."""
        if not workspace or ":" in workspace or "@" in workspace:
            raise ValueError(f"workspace name {workspace!r} cannot be a proxy user name")
        policy = WorkspacePolicy(
            mode=mode,
            token=secrets.token_urlsafe(18),
            blacklist=tuple(parse_blacklist(blacklist_text)),
        )
        with self._lock:
            policies = self._policies()
            policies[workspace] = policy
            self._save(policies)
        return ProxyCredentials(workspace, policy.token)

    def unregister(self, workspace: str) -> None:
        with self._lock:
            policies = self._policies()
            if policies.pop(workspace, None) is not None:
                self._save(policies)

    # -- process ----------------------------------------------------------------------------

    @property
    def ca_path(self) -> Path:
        """The proxy's CA certificate (PEM), to be trusted inside workspaces."""
        return self.confdir / CA_FILE

    def command(self) -> list[str]:
        return [self.mitmdump or find_mitmdump(), *self.arguments(self.state_dir, str(ADDON))]

    def arguments(self, state: PurePath, addon: str, upstream_ca: str | None = None) -> list[str]:
        """mitmdump's arguments with its state under `state` (here, or inside a container)."""
        argv = [
            "--quiet",
            "--listen-host",
            self.listen_host,
            "--listen-port",
            str(self.port),
            "--set",
            f"confdir={state / CONFDIR}",
            "--set",
            f"egress_config={state / POLICIES}",
            "--set",
            f"egress_log={state / EVENTS}",
            "--set",
            "connection_strategy=lazy",
            "-s",
            addon,
        ]
        if self.allow_private:
            argv += ["--set", "egress_allow_private=true"]
        if self.deny_networks:
            argv += ["--set", f"egress_deny_networks={','.join(self.deny_networks)}"]
        if upstream_ca is None and self.upstream_ca is not None:
            upstream_ca = str(self.upstream_ca)
        if upstream_ca is not None:
            argv += ["--set", f"ssl_verify_upstream_trusted_ca={upstream_ca}"]
        return argv

    def start(self, timeout_s: float = 30.0) -> None:
        """Start mitmdump on the kept port (or a drawn one) and wait until it accepts
        connections and its CA exists."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.confdir.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            self._save({})
        self.log_path.touch()
        kept = self.port
        for _ in range(1 if kept else PORT_TRIES):
            self.port = kept or draw_port(self.listen_host)
            try:
                self._launch(timeout_s)
                return
            except PortTaken:
                continue
        if kept:
            raise EgressProxyError(f"the egress proxy's port {self.listen_host}:{kept} is in use")
        raise EgressProxyError(f"no free port for the egress proxy on {self.listen_host}")

    def _launch(self, timeout_s: float) -> None:
        stderr_path = self.state_dir / "mitmdump.log"
        with stderr_path.open("ab") as stderr:
            started_at = stderr.tell()
            self._process = subprocess.Popen(
                self.command(), stdout=stderr, stderr=stderr, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                returncode, self._process = self._process.returncode, None
                output = _read_from(stderr_path, started_at)
                if "address already in use" in output.lower():
                    raise PortTaken(output)
                raise EgressProxyError(f"mitmdump exited {returncode}: {_tail(stderr_path)}")
            if self.ca_path.exists() and _accepts(self.listen_host, self.port):
                return
            time.sleep(0.1)
        self.stop()
        raise EgressProxyError(
            f"mitmdump did not listen within {timeout_s:.0f}s: {_tail(stderr_path)}"
        )

    def answers(self) -> bool:
        """Whether the proxy accepts connections on its address."""
        return _accepts(self.listen_host, self.port)

    def pull_events(self) -> None:
        """Bring new events into `log_path`: here the proxy writes there itself."""

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PortTaken(EgressProxyError):
    """The drawn port is in use: draw another."""


def draw_port(host: str) -> int:
    """A port of `PORTS` nothing is bound to on `host` now (the proxy may still lose it to
    another process before it binds: `start` then draws again)."""
    for _ in range(100):
        port = random.randrange(*PORTS)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise EgressProxyError(f"no free port in {PORTS[0]}-{PORTS[1] - 1} on {host}")


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host if host != "0.0.0.0" else "127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 10) -> str:
    text: Sequence[str] = path.read_text(errors="replace").splitlines() if path.exists() else []
    return " | ".join(text[-lines:]) or "(no output)"
