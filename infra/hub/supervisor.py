"""Keep the hub running next to the portal: `baseline serve` starts it and restarts it if it dies.

The hub is a child process (its own session, so a Ctrl-C aimed at the portal's terminal is
handled here, not raced); a crash is logged with its exit code and the hub restarts after a short,
growing back-off. Restarting loses no running server: the config keeps ``cleanup_servers = False``
and the spawner reconnects in `poll`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from infra.hub.config import HubConfig, start_hub
from infra.supervision import RestartingChild

log = logging.getLogger(__name__)

# In the hub's data directory: "<hub pid> <pid of the portal that started it>".
PID_FILE = "hub.pid"


def _command_line(pid: int) -> list[bytes]:
    """The process's arguments; none when it is gone (or a zombie, whose are empty)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.split(b"\0") if raw else []


def _parent(pid: int) -> int | None:
    try:  # the field after the command's name, which is in parentheses and may hold spaces
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def stop_left_behind(config: HubConfig, wait_s: float = 15.0) -> int | None:
    """Stop the hub a portal of this home started and left running when it was killed: the hub
    runs in its own session, so it outlives a SIGKILL'd portal with its ports, and the next
    portal could not start its own. Returns its pid, or None when none is left behind. Only a
    process running this home's hub config (a pid may have been reused since) whose portal is
    gone (it is not another live portal's hub) is stopped."""
    try:
        pid, portal = (int(n) for n in (config.data_dir / PID_FILE).read_text().split())
    except (OSError, ValueError):
        return None
    if os.fsencode(str(config.config_file)) not in _command_line(pid) or _parent(pid) == portal:
        return None
    os.kill(pid, signal.SIGTERM)  # the hub stops the proxy it started
    deadline = time.monotonic() + wait_s
    while _command_line(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _command_line(pid):
        os.kill(pid, signal.SIGKILL)
    log.warning("stopped JupyterHub (pid %s), left running by a portal of this home", pid)
    return pid


class HubSupervisor(RestartingChild):
    label = "JupyterHub"

    def __init__(self, config: HubConfig, log_file: Path | None = None) -> None:
        self.config = config
        self.log_file = log_file or config.data_dir / "jupyterhub.log"
        super().__init__()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        proc = start_hub(self.config, self.log_file)
        (self.config.data_dir / PID_FILE).write_text(f"{proc.pid} {os.getpid()}\n")
        log.info("JupyterHub started (pid %s), log %s", proc.pid, self.log_file)
        return proc
