"""The real server: `baseline demo` brings the portal up and /api/v1/health answers 200, and
SIGTERM stops it through its clean-up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port


def test_demo_serves_health(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "BASELINE_HOME": str(tmp_path)}
    env.pop("BASELINE_DATABASE_URL", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "baseline", "demo", "--port", str(port), "--no-live"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # the demo seeds real snapshot content first
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/v1/health", timeout=2
                ) as r:
                    status = r.status
                    body = r.read()
                break
            except OSError:
                time.sleep(0.5)
        assert server.poll() is None, "the server exited early"
        assert status == 200
        assert b'"status":"ok"' in body.replace(b" ", b"")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=5) as page:
            assert b"Log in to Baseline" in page.read()
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    # SIGTERM exits through the server's clean-up (what stops the hub, the worker and the egress
    # proxies), not by the signal's default (-15), whatever it was started with.
    assert server.returncode == 0, output[-2000:]
    assert "admin@example.org" in output
    assert "Traceback" not in output
