"""Host-side commands and host health, for the local engine and for GPU hosts over SSH.

A host is named by its Docker URL. `unix://...` hosts are this machine: commands run as local
subprocesses. `ssh://user@host[:port]` hosts are reached with paramiko, configured the way the
docker SDK's own SSH transport is (``~/.ssh/config`` for the identity file, host name and port;
``~/.ssh/known_hosts`` for the host key; unknown host keys are refused), so the command channel
and the Docker channel of a host always agree on who they are talking to. The runners return
`infra.gpus.CommandResult`, which is what the GPU inventory consumes.
"""

from __future__ import annotations

import shlex
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import paramiko

from infra.gpus import CommandResult, CommandRunner, local_runner

COMMAND_MISSING_EXIT = 127
SSH_CONFIG = Path("~/.ssh/config")


class RemoteError(RuntimeError):
    """The host could not be reached or refused us; the message says which host and why."""


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in; `key_filename` and `known_hosts` override ~/.ssh."""

    host: str
    port: int = 22
    user: str | None = None
    key_filename: str | None = None
    known_hosts: str | None = None

    @classmethod
    def from_url(
        cls, url: str, key_filename: str | None = None, known_hosts: str | None = None
    ) -> SshTarget:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != "ssh" or not parsed.hostname:
            raise RemoteError(f"not an ssh:// URL: {url!r}")
        host, port, user = parsed.hostname, parsed.port, parsed.username
        config_path = SSH_CONFIG.expanduser()
        if config_path.exists():
            config = paramiko.SSHConfig.from_path(str(config_path)).lookup(parsed.hostname)
            host = config.get("hostname", host)
            port = port or (int(config["port"]) if "port" in config else None)
            user = user or config.get("user")
            if key_filename is None and config.get("identityfile"):
                key_filename = config["identityfile"][0]
        return cls(host, port or 22, user, key_filename, known_hosts)


class SshRunner:
    """Runs argv on a remote host over one paramiko connection (reconnects when it dropped)."""

    def __init__(self, target: SshTarget, *, connect_timeout_s: float = 15.0) -> None:
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self._client: paramiko.SSHClient | None = None

    def _connect(self) -> paramiko.SSHClient:
        client = self._client
        transport = client.get_transport() if client is not None else None
        if client is not None and transport is not None and transport.is_active():
            return client
        client = paramiko.SSHClient()
        client.load_system_host_keys()
        if self.target.known_hosts:
            client.load_host_keys(self.target.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.target.host,
                port=self.target.port,
                username=self.target.user,
                key_filename=self.target.key_filename,
                timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s,
                auth_timeout=self.connect_timeout_s,
                allow_agent=False,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise RemoteError(
                f"ssh {self.target.user or ''}@{self.target.host}:{self.target.port}: {exc}"
            ) from exc
        self._client = client
        return client

    def __call__(self, argv: Sequence[str], timeout_s: float = 60.0) -> CommandResult:
        client = self._connect()
        command = shlex.join(argv)
        try:
            _, stdout, stderr = client.exec_command(command, timeout=timeout_s)
            out = stdout.read().decode(errors="replace")
            err = stderr.read().decode(errors="replace")
            code = stdout.channel.recv_exit_status()
        except (paramiko.SSHException, OSError, TimeoutError) as exc:
            raise RemoteError(f"ssh {self.target.host}: running {command!r} failed: {exc}") from exc
        return CommandResult(code, out, err)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def runner_for_url(url: str, key_filename: str | None = None) -> CommandRunner:
    """The command channel of the host behind a Docker URL."""
    if url.startswith("unix://"):
        return local_runner
    if url.startswith("ssh://"):
        return SshRunner(SshTarget.from_url(url, key_filename=key_filename))
    raise RemoteError(f"unsupported Docker URL {url!r}: use unix:///path or ssh://user@host")


@dataclass(frozen=True)
class HostHealth:
    """One health check: both channels answered, and what the engine reported."""

    url: str
    healthy: bool
    checked_at: datetime
    latency_ms: float | None = None
    docker_version: str | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    containers_running: int | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def check_host(url: str, *, key_filename: str | None = None, timeout_s: int = 20) -> HostHealth:
    """Healthy when the Docker API answers and a host command (`true`) succeeds."""
    now = datetime.now(UTC)
    started = time.monotonic()
    client: docker.DockerClient | None = None
    try:
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=timeout_s)
        info = client.info()
        runner = runner_for_url(url, key_filename)
        probe = runner(["true"])
        if isinstance(runner, SshRunner):
            runner.close()
        if probe.exit_code != 0:
            raise RemoteError(f"host command `true` exited {probe.exit_code}: {probe.stderr[:200]}")
    except Exception as exc:  # paramiko, docker and OS errors all mean "unhealthy, here is why"
        return HostHealth(url=url, healthy=False, checked_at=now, error=_one_line(exc))
    finally:
        if client is not None:
            client.close()
    return HostHealth(
        url=url,
        healthy=True,
        checked_at=now,
        latency_ms=round((time.monotonic() - started) * 1000, 1),
        docker_version=str(info.get("ServerVersion")),
        cpus=int(info.get("NCPU", 0)),
        memory_mib=int(info.get("MemTotal", 0)) // (1024 * 1024),
        containers_running=int(info.get("ContainersRunning", 0)),
        details={"os": info.get("OperatingSystem"), "cgroup": info.get("CgroupVersion")},
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
