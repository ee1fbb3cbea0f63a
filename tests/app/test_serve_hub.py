"""`baseline serve` starts JupyterHub next to the portal and stops it when it stops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.hub_world import require_proxy
from tests.ports import free_port

pytestmark = pytest.mark.slow


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_serve_supervises_the_hub_and_can_leave_it_out(tmp_path: Path) -> None:
    port, hub_port = free_port(), free_port()
    env = {
        **os.environ,
        "BASELINE_HOME": str(tmp_path),
        "BASELINE_HUB_PORT": str(hub_port),
        "BASELINE_HUB_API_PORT": str(free_port()),
        "BASELINE_HUB_PROXY_API_PORT": str(free_port()),
        "BASELINE_HUB_PORTAL_URL": f"http://127.0.0.1:{port}",
        "BASELINE_HUB_PROXY_CMD": require_proxy(),
    }
    env.pop("BASELINE_DATABASE_URL", None)
    init = subprocess.run(
        [sys.executable, "-m", "baseline", "init"], env=env, capture_output=True, text=True
    )
    assert init.returncode == 0, init.stderr
    hub = f"http://127.0.0.1:{hub_port}/hub/health"
    server = subprocess.Popen(
        [sys.executable, "-m", "baseline", "serve", "--port", str(port), "--no-scheduler"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None and not _answers(hub):
            time.sleep(0.5)
        assert _answers(hub), "the hub did not come up next to the portal"
        assert _answers(f"http://127.0.0.1:{port}/api/v1/health")
        assert (tmp_path / "hub" / "jupyterhub.sqlite").exists()  # under BASELINE_HOME
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert "JupyterHub on" in output
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _answers(hub):
        time.sleep(0.5)
    assert not _answers(hub), "the hub outlived `baseline serve`"

    # BASELINE_HUB_MANAGED=false: the portal alone (pointing at a hub run elsewhere).
    alone = subprocess.Popen(
        [sys.executable, "-m", "baseline", "serve", "--port", str(port), "--no-scheduler"],
        env={**env, "BASELINE_HUB_MANAGED": "false"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _answers(
            f"http://127.0.0.1:{port}/api/v1/health"
        ):
            time.sleep(0.5)
        assert not _answers(hub)
    finally:
        alone.terminate()
        output, _ = alone.communicate(timeout=60)
    assert "JupyterHub on" not in output
