"""The hub side of a workspace's tunnel: one `docker exec -i` carrying `infra.hub.tunnel`.

`WorkspaceChannel` runs the tunnel's container side as root inside the workspace (so the
participant's processes cannot write into its pipes) and, in the hub process, listens on
127.0.0.1:`host_port` (the proxy's target for the server) forwarding to the single-user server's
port inside the container; the container side forwards its loopback port to the hub's API. It dies
with the hub process; the spawner's `poll` opens it again on the same port after a hub restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

from infra.hub.tunnel import Mux

TUNNEL_SOURCE = (Path(__file__).with_name("tunnel.py")).read_text()


def docker_base(docker_cmd: str, docker_url: str) -> list[str]:
    return [docker_cmd, "-H", docker_url]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WorkspaceChannel:
    def __init__(
        self,
        docker: list[str],
        container: str,
        host_port: int,
        inside_port: int,
        hub_port_inside: int,
        hub_port: int,
    ) -> None:
        self.docker = docker
        self.container = container
        self.host_port = host_port
        self.inside_port = inside_port
        self.hub_port_inside = hub_port_inside
        self.hub_port = hub_port
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
        argv = [
            *self.docker,
            "exec",
            "-i",
            "-u",
            "root",
            self.container,
            "python3",
            "-c",
            TUNNEL_SOURCE,
            f"{self.hub_port_inside}:{self.hub_port}",
        ]
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=dict(os.environ),
            limit=2**22,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.mux = Mux(self.proc.stdout, self.proc.stdin, 0, frozenset({self.hub_port}))
        try:
            await self.mux.listen(self.host_port, self.inside_port)
        except OSError:
            await self.close()
            raise
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
