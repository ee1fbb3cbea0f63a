"""A dockerd that crashes mid-attempt, on the real engine: the workspace comes back with its files.

This module kills the machine's dockerd, which every Docker test of the run shares: scripts/test.sh
runs it alone, after the parallel run has ended (SERIAL_MODULES in tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baseline.context import Context
from baseline.models import Host, WorkspaceStatus
from baseline.workspaces import backends, workspaces
from tests.baseline.workspaces.test_workspaces import _attempt, factory, local_host
from tests.docker_env import DOCKERD_PID, ensure_dockerd, kill_dockerd, start_dockerd, test_image

pytestmark = pytest.mark.docker
__all__ = ["local_host", "test_image"]


@pytest.mark.slow
def test_dockerd_killed_mid_attempt_comes_back_with_files(
    ctx: Context, local_host: int, test_image: str
) -> None:
    if not DOCKERD_PID.exists():
        pytest.skip(f"{DOCKERD_PID} is absent: dockerd is not managed on this machine")
    with ctx.session() as session:
        attempt = _attempt(session)
        ws = workspaces.request_workspace(
            session,
            image=test_image,
            hardware_profile="cpu",
            attempt=attempt,
            backend_factory=factory,
        )
        session.commit()  # so that local_host's teardown finds and destroys it if this test fails
        host = session.get(Host, local_host)
        assert host is not None
        with backends.open_backend(factory, host) as backend:
            result = backend.exec(
                workspaces.handle_of(ws),
                ["sh", "-c", "echo progress > model.txt && git add -A && git commit -qm w"],
            )
            assert result.exit_code == 0, result.output
        try:
            kill_dockerd()
            start_dockerd()
        finally:
            ensure_dockerd()  # whatever happened, the rest of the suite gets its engine back
        report = workspaces.reconcile(session, factory)
        assert ws.name in report.restarted, report
        assert ws.status is WorkspaceStatus.RUNNING
        with backends.open_backend(factory, host) as backend:
            back = backend.exec(
                workspaces.handle_of(ws), ["sh", "-c", "cat model.txt; git log --format=%s"]
            )
        assert back.output == b"progress\nw\n"
        assert Path(f"/proc/{int(DOCKERD_PID.read_text())}").exists()
