"""Keep the hub running next to the portal: `baseline serve` starts it and restarts it if it dies.

The hub is a child process (its own session, so a Ctrl-C aimed at the portal's terminal is
handled here, not raced); a crash is logged with its exit code and the hub restarts after a short,
growing back-off. Restarting loses no running server: the config keeps ``cleanup_servers = False``
and the spawner reconnects in `poll`.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path

from infra.hub.config import HubConfig, start_hub

log = logging.getLogger(__name__)


class HubSupervisor:
    def __init__(self, config: HubConfig, log_file: Path | None = None) -> None:
        self.config = config
        self.log_file = log_file or config.data_dir / "jupyterhub.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="hub-supervisor", daemon=True)

    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = start_hub(self.config, self.log_file)
        log.info("JupyterHub started (pid %s), log %s", self.proc.pid, self.log_file)
        self.thread.start()

    def _watch(self) -> None:
        delay = 1.0
        while not self.stopping.is_set():
            assert self.proc is not None
            code = self.proc.wait()
            if self.stopping.is_set():
                return
            log.error("JupyterHub exited with %s; restarting in %.0f s", code, delay)
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, 60.0)
            self.proc = start_hub(self.config, self.log_file)

    def stop(self, timeout: float = 15.0) -> None:
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
