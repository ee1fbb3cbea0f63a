"""A terminal session in a real attempt container is recorded and reaches the coordinator.

The workspace is launched by Baseline (so the recording wrapper is placed as at any container
creation); the terminal is a login shell on a pseudo-terminal, as JupyterLab's terminals are,
driven through `docker exec`, so no hub is needed here. Coordinators collect and read it on the
attempt's timeline; a grader is refused.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.context import Context
from baseline.models import AuditEvent, Role, Workspace
from tests.conftest import Users, login
from tests.docker_env import docker_url, test_image
from tests.hub_world import HubWorld

pytestmark = [pytest.mark.docker]
__all__ = ["test_image"]


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: the recording does not depend on the database engine."""
    return f"sqlite:///{tmp_path / 'test.db'}"


def test_terminal_session_is_recorded_and_shown_to_coordinators_only(
    ctx: Context, app: Flask, client: FlaskClient, users: Users, test_image: str
) -> None:
    docker_url("unix")
    world = HubWorld(ctx=ctx, app=app, image=test_image, home=ctx.settings.home)
    try:
        world.add_participants(1)
        me = world.participants[0]
        with ctx.session() as session:
            container = session.scalars(
                select(Workspace.name).where(Workspace.attempt_id == me.attempt_id)
            ).one()
        typed = subprocess.run(
            ["docker", "exec", "-i", "-u", "participant", container,
             "timeout", "30", "script", "-q", "-c", "sh -l", "/dev/null"],
            input=b"echo recorded-$((6*7)) > /home/submission/out.txt\nexit\n",
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert typed.returncode == 0, typed.stderr
        # The shell's senders hand the last bytes to the recorder after the shell is gone.
        deadline = time.monotonic() + 10
        while b"recorded-" not in subprocess.run(
            ["docker", "exec", container, "cat", "/var/log/baseline/shell_history"],
            capture_output=True, check=False,
        ).stdout:  # fmt: skip
            assert time.monotonic() < deadline, "the recorder never got the shell history"
            time.sleep(0.2)
        login(client, users[Role.COORDINATOR].email)
        page = client.get(f"/attempts/{me.attempt_id}/terminal").get_data(as_text=True)
        assert 'id="no-recordings"' in page
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf
        collected = client.post(
            f"/attempts/{me.attempt_id}/terminal/collect", data={"csrf_token": csrf.group(1)}
        )
        assert collected.status_code == 302
        html = client.get(f"/attempts/{me.attempt_id}/terminal").get_data(as_text=True)
        # The session as the participant saw it, and the command in the shell history.
        assert "$ echo recorded-$((6*7)) &gt; /home/submission/out.txt" in html
        assert "Terminal session <code>/var/log/baseline/terminal/" in html
        history = r"<code>/var/log/baseline/shell_history</code>.*?</pre>"
        kept_history = re.search(history, html, re.S)
        assert kept_history and "echo recorded-$((6*7))" in kept_history.group(0)
        # Issue 39 item 3: the records are written by the root recorder where the participant
        # cannot write: emptying, appending to or removing them is refused.
        for attack in (
            ": > /var/log/baseline/shell_history",
            "echo forged >> /var/log/baseline/shell_history",
            "for f in /var/log/baseline/terminal/*; do : > $f; done",
            "rm -f /var/log/baseline/terminal/* /var/log/baseline/shell_history",
            "mv /var/log/baseline /tmp/moved",
        ):
            refused = subprocess.run(
                ["docker", "exec", "-u", "participant", container, "sh", "-c", attack],
                capture_output=True, check=False,
            )  # fmt: skip
            assert refused.returncode != 0, attack
        # The participant's own fallback history (bash's HISTFILE under /home/logs) they can
        # empty: the next collection keeps what was kept, beside the emptied file, and says so.
        erased = subprocess.run(
            ["docker", "exec", "-u", "participant", container,
             "sh", "-c", ": > /home/logs/shell_history"],
            capture_output=True, check=False,
        )  # fmt: skip
        assert erased.returncode == 0, erased.stderr
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', html)
        assert csrf
        client.post(
            f"/attempts/{me.attempt_id}/terminal/collect", data={"csrf_token": csrf.group(1)}
        )
        html = client.get(f"/attempts/{me.attempt_id}/terminal").get_data(as_text=True)
        assert 'id="tampered"' in html and "1 record(s) were found shortened" in html
        kept = re.search(
            r"<code>/home/logs/shell_history \(as collected before it was shortened.*?</pre>",
            html,
            re.S,
        )
        # (bash's own file holds what it wrote at exit; each command went to the recorder)
        assert kept and "exit" in kept.group(0)
        now = re.search(r"<code>/home/logs/shell_history</code>.*?</pre>", html, re.S)
        assert now and "exit" not in now.group(0)
        kept_history = re.search(history, html, re.S)
        assert kept_history and "echo recorded-$((6*7))" in kept_history.group(0)
        with ctx.session() as session:
            events = session.scalars(
                select(AuditEvent).where(AuditEvent.action == "terminal.tampered")
            ).all()
        assert [e.details["path"] for e in events] == ["/home/logs/shell_history"]
        grader = client.application.test_client()
        login(grader, users[Role.GRADER].email)
        assert grader.get(f"/attempts/{me.attempt_id}/terminal").status_code == 403
    finally:
        world.close()
