"""Tunnels into a workspace over `docker exec -i`, carrying `infra.hub.tunnel`'s container side.

`ExecTunnel` is the part every such tunnel shares: the container side runs as root inside the
workspace (so the participant's processes cannot write into its pipes), listens on the
container's loopback and forwards each connection made there over the exec's stdin/stdout to
this process, which connects it to one allowed port on its own loopback. The exec is the one
channel to a workspace that always exists: it needs no network (egress policy `none`) and, for an
`ssh://` host, travels over the Docker CLI's SSH connection.

`WorkspaceChannel` is the hub's: it also listens on 127.0.0.1:`host_port` in the hub process (the
proxy's target for the single-user server) forwarding to the server's port inside the container,
and the container side forwards its loopback port to the hub's API. It dies with the hub process;
the spawner's `poll` opens it again on the same port after a hub restart. The portal relay
(`infra.portal_relay`) uses `ExecTunnel` as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from infra.hub.tunnel import Mux

TUNNEL_SOURCE = (Path(__file__).with_name("tunnel.py")).read_text()


def docker_base(docker_cmd: str, docker_url: str) -> list[str]:
    return [docker_cmd, "-H", docker_url]


class ExecTunnel:
    """The container listens on `inside_port`; this process connects only to `target_port`."""

    def __init__(self, docker: list[str], container: str, inside_port: int, target_port: int):
        self.docker = docker
        self.container = container
        self.inside_port = inside_port
        self.target_port = target_port
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None
        self.mux: Mux | None = None

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and self.task is not None
            and not self.task.done()
        )

    async def open(self) -> None:
        await self._start()
        self._run()

    async def _start(self) -> Mux:
        """Start the exec and the multiplexer on its pipes (not yet reading them)."""
        forward = f"{self.inside_port}:{self.target_port}"
        argv = [*self.docker, "exec", "-i", "-u", "root", self.container,
                "python3", "-c", TUNNEL_SOURCE, forward]  # fmt: skip
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=dict(os.environ),
            limit=2**22,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.mux = Mux(self.proc.stdout, self.proc.stdin, 0, frozenset({self.target_port}))
        return self.mux

    def _run(self) -> None:
        assert self.mux is not None
        self.task = asyncio.ensure_future(self.mux.run())

    async def close(self) -> None:
        if self.mux is not None:
            for server in self.mux.servers:
                server.close()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self.task is not None:
            self.task.cancel()
        self.proc = self.task = self.mux = None


class WorkspaceChannel(ExecTunnel):
    """The hub's tunnel: the single-user server reachable on the hub's `host_port`, and the
    hub's API (`hub_port`) reachable from the container's `hub_port_inside`."""

    def __init__(
        self,
        docker: list[str],
        container: str,
        host_port: int,
        inside_port: int,
        hub_port_inside: int,
        hub_port: int,
    ) -> None:
        super().__init__(docker, container, hub_port_inside, hub_port)
        self.host_port = host_port
        self.server_port = inside_port

    async def open(self) -> None:
        mux = await self._start()
        try:
            self.host_port = await mux.listen(self.host_port, self.server_port)
        except OSError:
            await self.close()
            raise
        self._run()
