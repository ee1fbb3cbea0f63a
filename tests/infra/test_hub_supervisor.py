"""A hub left running by a portal that was killed is stopped by the next one; no other is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.hub.config import HubConfig
from infra.hub.supervisor import PID_FILE, stop_left_behind


@pytest.fixture
def config(tmp_path: Path) -> HubConfig:
    return HubConfig(data_dir=tmp_path, portal_url="http://127.0.0.1:1", public_url="http://x")


@pytest.fixture
def fake_hub(config: HubConfig) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line runs this home's hub config, as `jupyterhub -f` does."""
    command = [sys.executable, "-c", "import time; time.sleep(60)", "-f", str(config.config_file)]
    process = subprocess.Popen(command)
    yield process
    process.kill()
    process.wait()


def _gone_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_the_hub_of_a_killed_portal_is_stopped(
    config: HubConfig, fake_hub: subprocess.Popen[bytes]
) -> None:
    """It outlived its portal (its own session) with its ports: the next portal's hub could not
    start, and the hub's port was said to be in use."""
    (config.data_dir / PID_FILE).write_text(f"{fake_hub.pid} {_gone_pid()}\n")
    assert stop_left_behind(config, wait_s=10) == fake_hub.pid
    assert fake_hub.wait(timeout=10) == -15  # SIGTERM: a hub stops the proxy it started


def test_a_live_portals_hub_and_other_processes_are_left_alone(
    config: HubConfig, fake_hub: subprocess.Popen[bytes]
) -> None:
    pid_file = config.data_dir / PID_FILE
    assert stop_left_behind(config) is None  # no pid file: no hub started here
    pid_file.write_text(f"{fake_hub.pid} {os.getpid()}\n")  # its portal (here: this test) lives
    assert stop_left_behind(config) is None
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the pid reused by a process that does not run this home's hub
        pid_file.write_text(f"{other.pid} {_gone_pid()}\n")
        assert stop_left_behind(config) is None
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert fake_hub.poll() is None
