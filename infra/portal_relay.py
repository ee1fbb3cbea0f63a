"""The portal relay: how `task` inside a workspace reaches the portal, whatever its egress policy.

A workspace may have no network at all (policy ``none``), sit behind the egress firewall, or run
on a remote Docker host reached over ``ssh://``. The one channel that always exists is the one
Baseline already drives the workspace through: ``docker exec``. So, as the hub does for
JupyterLab, the relay runs the tunnel's container side as root in every live attempt container
(`infra.hub.channel.ExecTunnel`); it listens on the container's loopback
(``127.0.0.1:<inside port>``) and each connection made there is carried over the exec's
stdin/stdout to the relay, which connects it to the portal's port on the relay's own loopback,
and to nothing else (the tunnel's allowed targets). No network path into or out of the workspace
is opened, and for an ``ssh://`` host the exec simply travels over the Docker CLI's SSH
connection.

What comes through is plain HTTP to the portal; the only routes a workspace's credentials open
are the attempt-token routes (`/api/v1/attempts/<id>/workspace/...`, one attempt each).

The relay keeps one channel per workspace: `sync` opens the missing ones (new or re-created
containers, or a channel whose exec died) and closes those whose workspace is gone. It runs on an
event loop of its own in a background thread (`start`/`stop`), next to the portal.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from infra.hub.channel import ExecTunnel, docker_base

log = logging.getLogger(__name__)

# workspace name -> (Docker URL, container id)
Targets = dict[str, tuple[str, str]]


class PortalRelay:
    """Keeps a channel open into every live attempt workspace (`targets` says which)."""

    def __init__(
        self,
        targets: Callable[[], Targets],
        portal_port: int,
        inside_port: int,
        docker_cmd: str = "docker",
        interval_s: float = 5.0,
    ) -> None:
        self.targets = targets
        self.portal_port = portal_port
        self.inside_port = inside_port
        self.docker_cmd = docker_cmd
        self.interval_s = interval_s
        self.channels: dict[str, tuple[str, ExecTunnel]] = {}
        self.refused: set[tuple[str, str]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    async def sync(self) -> None:
        """Open what is missing or dead, close what is no longer wanted."""
        loop = asyncio.get_running_loop()
        wanted = await loop.run_in_executor(None, self.targets)
        for name in list(self.channels):
            container, channel = self.channels[name]
            if name not in wanted or wanted[name][1] != container or not channel.alive:
                await channel.close()
                del self.channels[name]
        for name, (url, container) in wanted.items():
            if name in self.channels:
                continue
            channel = ExecTunnel(
                docker_base(self.docker_cmd, url), container, self.inside_port, self.portal_port
            )
            try:
                await channel.open()
            except OSError as exc:
                # Said once per container, not every round: the log stays readable when, say,
                # the Docker CLI is missing on a portal whose workspaces are sandboxes.
                if (name, container) not in self.refused:
                    self.refused.add((name, container))
                    log.warning("portal relay: cannot open a channel into %s: %s", name, exc)
                continue
            self.refused.discard((name, container))
            self.channels[name] = (container, channel)

    async def _main(self) -> None:
        while not self._stopped.is_set():
            try:
                await self.sync()
            except Exception:  # the relay must outlive one bad round (database briefly down)
                log.exception("portal relay: sync failed")
            await asyncio.sleep(self.interval_s)
        for _, channel in list(self.channels.values()):
            await channel.close()
        self.channels.clear()

    def start(self) -> None:
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._main())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="portal-relay", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
