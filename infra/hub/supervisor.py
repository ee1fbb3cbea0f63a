"""Keep the hub running next to the portal: `baseline serve` starts it and restarts it if it dies.

The hub is a child process (its own session, so a Ctrl-C aimed at the portal's terminal is
handled here, not raced); a crash is logged with its exit code and the hub restarts after a short,
growing back-off. Restarting loses no running server: the config keeps ``cleanup_servers = False``
and the spawner reconnects in `poll`.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from infra.hub.config import HubConfig, start_hub
from infra.supervision import RestartingChild

log = logging.getLogger(__name__)


class HubSupervisor(RestartingChild):
    label = "JupyterHub"

    def __init__(self, config: HubConfig, log_file: Path | None = None) -> None:
        self.config = config
        self.log_file = log_file or config.data_dir / "jupyterhub.log"
        super().__init__()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        proc = start_hub(self.config, self.log_file)
        log.info("JupyterHub started (pid %s), log %s", proc.pid, self.log_file)
        return proc
