"""A JupyterHub Spawner that starts JupyterLab inside an attempt's existing workspace container.

No public spawner does this (DockerSpawner makes a container per user); Baseline already owns a
container per attempt with its image, limits, GPUs and egress rules, and the participant must work
in exactly that one. So:

- `start` asks the portal which container the hub user's server (``a<attempt id>``) belongs to
  (refused unless it is the user's own live attempt with a running workspace), then
  ``docker exec``s ``jupyterhub-singleuser`` into it as the unprivileged workspace user, detached,
  with the hub's `get_env()` passed on every start (a container's own environment is fixed at its
  creation, and the API token changes with every spawn). Values travel in the docker client's
  environment (``-e NAME``), never on a command line.
- The server listens on the container's loopback only; `infra.hub.channel` tunnels the proxy to it
  and it to the hub's API over a second ``docker exec`` (works with no network, behind the egress
  firewall, and on ssh:// hosts).
- `poll` looks at the exec'd process (its pid inside the container, checked to still be our
  single-user server and not a zombie), never at the container; `stop` signals that process only
  (as the workspace user: root inside a workspace may not signal it), never the container:
  the workspace keeps running, Baseline owns its life cycle.
- `get_state`/`load_state` keep container, engine, pid and tunnel port, so with
  ``cleanup_servers = False`` a restarted hub polls the same process, re-opens the tunnel on the
  same port, and the proxy route comes back.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from typing import Any
from urllib.parse import quote, urlparse

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import Unicode

from infra.hub.channel import WorkspaceChannel, docker_base
from infra.hub.config import HUB_API_PORT_INSIDE, SINGLEUSER_PORT, frame_ancestors
from infra.hub.portal_client import PortalRefused, call
from infra.workspace import PARTICIPANT_USER

LOG_FILE = "/home/logs/jupyterhub-singleuser.log"
# `alive PID`: the process exists, is not a zombie (PID 1 of a workspace may not reap), and is
# still a jupyterhub-singleuser (pids are reused after a container restart).
ALIVE = (
    'alive() { s=$(cat /proc/$1/stat 2>/dev/null) || return 1; case "$s" in *") Z "*) return 1;; '
    "esac; tr '\\0' ' ' < /proc/$1/cmdline | grep -q jupyterhub-singleuser; }; "
)
# Nothing inside the server culls: a kernel running a long, silent training job is never shut
# down for "inactivity", and the server never stops itself; Baseline owns both lives.
NO_CULLING = (
    "--MappingKernelManager.cull_idle_timeout=0 --MappingKernelManager.cull_busy=False "
    "--ServerApp.shutdown_no_activity_timeout=0"
)
# The server takes its port or fails: on its own it would listen on the next free one, where
# the tunnel never looks, and the hub would wait for it until its spawn timed out.
ONE_PORT = "--ServerApp.port_retries=0"
# JupyterLab's own settings, as the participant's defaults: no "official Jupyter news?" pop-up
# and no update check (the workspace has no network; a study's participant has no use for them).
LAB_SETTINGS = (
    '"$HOME/.jupyter/lab/user-settings/@jupyterlab/apputils-extension/'
    'notification.jupyterlab-settings"'
)
NOTIFICATION_SETTINGS = '{"fetchNews": "false", "checkForUpdates": false}'


def launch_script(portal_url: str) -> str:
    """The shell command that starts the single-user server in the workspace and prints its pid.

    Its pages answer with the hub's frame rule (`infra.hub.config.frame_ancestors`), so that the
    portal's work page can show JupyterLab under its bar and no other site can frame it."""
    headers = {"headers": {"Content-Security-Policy": frame_ancestors(portal_url)}}
    framing = shlex.quote(f"--ServerApp.tornado_settings={json.dumps(headers)}")
    return (
        f"mkdir -p $(dirname {LAB_SETTINGS}) && "
        f"{{ [ -f {LAB_SETTINGS} ] || printf '%s' '{NOTIFICATION_SETTINGS}' > {LAB_SETTINGS}; }}; "
        f"cd /home/submission && nohup setsid jupyterhub-singleuser {NO_CULLING} {ONE_PORT} "
        f"{framing} >>{LOG_FILE} 2>&1 </dev/null & echo $!"
    )


class WorkspaceSpawnError(web.HTTPError):
    """The single-user server could not be started in the workspace; says why.

    An HTTPError, and with `jupyterhub_message`, because that is what the hub shows on its spawn
    error pages (a fast failure, and the spawn-pending page of a slow one): the participant reads
    the portal's reason (e.g. the attempt ended at its time limit), not a bare 500.
    """

    def __init__(self, message: str) -> None:
        super().__init__(409, message.replace("%", "%%"))
        self.jupyterhub_message = message

    def __str__(self) -> str:
        return str(self.jupyterhub_message)


class WorkspaceSpawner(Spawner):
    portal_url = Unicode(config=True, help="How the hub reaches the portal.")
    service_token = Unicode(config=True, help="The token shared by the hub and the portal.")
    docker_cmd = Unicode("docker", config=True, help="The docker client used for exec.")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.container = ""
        self.docker_url = ""
        self.pid = 0
        self.host_port = 0
        self.channel: WorkspaceChannel | None = None

    # -- state ------------------------------------------------------------------------------

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.container = str(state.get("container", ""))
        self.docker_url = str(state.get("docker_url", ""))
        self.pid = int(state.get("pid", 0))
        self.host_port = int(state.get("host_port", 0))

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.pid:
            state.update(
                container=self.container,
                docker_url=self.docker_url,
                pid=self.pid,
                host_port=self.host_port,
            )
        return state

    def clear_state(self) -> None:
        super().clear_state()
        self.container = self.docker_url = ""
        self.pid = self.host_port = 0

    # -- docker -----------------------------------------------------------------------------

    def _docker(self) -> list[str]:
        return docker_base(self.docker_cmd, self.docker_url)

    async def _run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 60
    ) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, f"{argv[:4]} timed out after {timeout}s"
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")

    async def _as_root(self, script: str) -> tuple[int, str]:
        return await self._run(
            [*self._docker(), "exec", "-u", "root", self.container, "sh", "-c", script]
        )

    def _hub_port(self) -> int:
        return urlparse(self.hub.api_url).port or 8081

    async def _open_channel(self) -> None:
        if self.channel is not None and self.channel.alive:
            return
        if self.channel is not None:
            await self.channel.close()
        self.channel = WorkspaceChannel(
            self._docker(),
            self.container,
            self.host_port,
            SINGLEUSER_PORT,
            HUB_API_PORT_INSIDE,
            self._hub_port(),
        )
        await self.channel.open()
        self.host_port = self.channel.host_port  # kept: a hub restart reopens the same port

    async def _close_channel(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    # -- the Spawner API --------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        path = f"/hub-service/server?user={quote(self.user.name)}&name={quote(self.name)}"
        try:
            target = await call(self.portal_url, self.service_token, path)
        except PortalRefused as exc:
            raise WorkspaceSpawnError(exc.message) from exc
        self.container = str(target["container"])
        self.docker_url = str(target["docker_url"])
        if self.pid:  # a leftover of ours from an earlier start: never two servers per attempt
            await self._stop_process()
        self.ip, self.port = "127.0.0.1", SINGLEUSER_PORT
        env = self.get_env()
        argv = [*self._docker(), "exec", "-u", PARTICIPANT_USER, "-w", "/home/submission"]
        for name in sorted(env):
            argv += ["-e", name]
        rc, out = await self._run(
            [*argv, self.container, "sh", "-c", launch_script(self.portal_url)], env=env
        )
        pid = out.strip().splitlines()[-1] if out.strip() else ""
        if rc != 0 or not pid.isdigit():
            raise WorkspaceSpawnError(
                f"the workspace {self.container} did not start JupyterLab (exit {rc}): "
                + out.strip()[-300:]
            )
        self.pid = int(pid)
        await self._open_channel()
        self.log.info(
            "server %s: pid %s in %s, port %s",
            self._log_name,
            self.pid,
            self.container,
            self.host_port,
        )
        return ("127.0.0.1", self.host_port)

    async def poll(self) -> int | None:
        if not self.pid or not self.container:
            return 0
        rc, _ = await self._as_root(ALIVE + f"alive {self.pid}")
        if rc != 0:
            await self._close_channel()
            return 1
        try:
            await self._open_channel()  # after a hub restart: the route's target comes back
        except OSError as exc:
            self.log.warning("tunnel to %s not reopened: %s", self.container, exc)
        return None

    async def _stop_process(self) -> None:
        pid = self.pid
        script = ALIVE + (
            f"kill -TERM {pid}; i=0; while alive {pid} && [ $i -lt 50 ]; do sleep 0.1; "
            f"i=$((i+1)); done; if alive {pid}; then kill -KILL {pid}; sleep 0.3; fi; "
            f"if alive {pid}; then echo 'still running'; exit 1; fi"
        )
        # As the workspace user, who owns the process: root in the workspace may not signal it.
        argv = [*self._docker(), "exec", "-u", PARTICIPANT_USER, self.container, "sh", "-c", script]
        rc, out = await self._run(argv)
        if rc != 0:
            self.log.error("server %s (pid %s) not stopped: %s", self._log_name, pid, out[-300:])
        else:
            self.log.info("server %s (pid %s) stopped", self._log_name, pid)

    async def stop(self, now: bool = False) -> None:
        if self.pid and self.container:
            await self._stop_process()
        await self._close_channel()
        self.pid = 0
