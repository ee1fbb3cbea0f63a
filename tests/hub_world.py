"""A real portal, a real JupyterHub with configurable-http-proxy, and launched Docker workspaces.

`HubWorld` serves the portal (the Flask app, threaded) on a free port, starts the hub from the
config Baseline generates (`infra.hub.config`) on free ports under the test's BASELINE_HOME, and
launches human attempts on the local dockerd with the workspace image. Everything Docker-side
carries the test labels and is destroyed at the end; the hub is terminated.
"""

from __future__ import annotations

import html
import io
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from flask import Flask
from sqlalchemy import select
from werkzeug.serving import make_server

from baseline.attempts import launch, snapshots
from baseline.config import Settings
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import Attempt, AttemptStatus, Host, Role, Workspace
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import terminal_records, workspaces
from infra.docker_backend import DockerBackend
from infra.hub.config import HubConfig, start_hub
from infra.workspace import WorkspaceBackend
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, unavailable
from tests.ports import free_port

PASSWORD = "hub-participant-pw"


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


def hub_extra() -> dict[str, object]:
    """Settings for one test's portal and hub: free ports, the proxy found on this machine."""
    return {
        "hub_portal_url": f"http://127.0.0.1:{free_port()}",
        "hub_port": free_port(),
        "hub_api_port": free_port(),
        "hub_proxy_api_port": free_port(),
        "hub_proxy_cmd": require_proxy(),
        "hub_poll_interval": 3,
    }


def require_proxy() -> str:
    found = os.environ.get("BASELINE_HUB_PROXY_CMD") or shutil.which("configurable-http-proxy")
    if not found:
        unavailable("configurable-http-proxy is not installed (scripts/services/35-hub.sh)")
    assert found is not None
    return found


def require_jupyter_image(image: str) -> None:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "which", "jupyterhub-singleuser"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"{image} has no jupyterhub-singleuser: rebuild it (baseline image build cpu)")


@dataclass
class Participant:
    user_id: int
    email: str
    attempt_id: int

    @property
    def hub_user(self) -> str:
        return f"u{self.user_id}"

    @property
    def server(self) -> str:
        return f"a{self.attempt_id}"


@dataclass
class HubWorld:
    ctx: Context
    app: Flask
    image: str
    home: Path
    portal_url: str = ""
    config: HubConfig | None = None
    hub: subprocess.Popen[bytes] | None = None
    _server: object = None
    _thread: threading.Thread | None = None
    study_id: int = 0
    participants: list[Participant] = field(default_factory=list)

    # -- set-up -----------------------------------------------------------------------------

    def start_portal(self) -> None:
        port = int(str(self.ctx.settings.extra["hub_portal_url"]).rsplit(":", 1)[1])
        server = make_server("127.0.0.1", port, self.app, threaded=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        self.portal_url = f"http://127.0.0.1:{port}"

    def start_hub(self) -> None:
        """Start the hub from the same settings the portal reads (free ports, this test's home)."""
        require_proxy()
        self.config = hub_config(self.ctx.settings)
        self.hub = start_hub(self.config, self.home / "jupyterhub.log")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.hub.poll() is not None:
                break
            try:
                if requests.get(self.hub_url("/hub/health"), timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        pytest.fail("JupyterHub did not come up:\n" + self.hub_log()[-3000:])

    def stop_hub(self) -> None:
        if self.hub is not None and self.hub.poll() is None:
            self.hub.terminate()
            try:
                self.hub.wait(30)
            except subprocess.TimeoutExpired:
                self.hub.kill()
                self.hub.wait()

    def hub_log(self) -> str:
        path = self.home / "jupyterhub.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def add_participants(self, count: int, engine_url: str = LOCAL_URL) -> None:
        """Human attempts launched (clock waiting for the first login) on the engine at the URL."""
        with self.ctx.session() as session:
            host = workspaces.add_host(session, "engine", engine_url, None)
            assert workspaces.check_host(session, host).healthy
            study = studies.create_study(
                session, studies.StudySpec(name="hub study", egress_policy="none"), None
            )
            paper_task = tasks.import_demo_tasks(session, self.ctx.settings)[0]
            studies.add_task(session, study, paper_task, None)
            session.flush()
            session.refresh(study)
            self.study_id = study.id
            made = []
            for n in range(count):
                email = f"hub-p{n}@test.example"
                user = accounts.create_user(session, email, f"P{n}", PASSWORD, Role.PARTICIPANT)
                participant = studies.enroll_human(session, study.id, user, None)
                terminal_records.accept_consent(session, participant, user.id)
                attempt = studies.create_attempt(session, participant, paper_task, None)
                made.append((user.id, email, attempt.id))
        for user_id, email, attempt_id in made:
            status = launch.launch(
                self.ctx, attempt_id, None, image=self.image, backend_factory=factory
            )
            assert status is AttemptStatus.READY, self._not_placed(attempt_id)
            self.participants.append(Participant(user_id, email, attempt_id))

    def _not_placed(self, attempt_id: int) -> str:
        """Why the attempt's workspace was not placed, for a failed launch's message."""
        with self.ctx.session() as session:
            errors = session.scalars(
                select(Workspace.last_error).where(Workspace.attempt_id == attempt_id)
            ).all()
        return f"attempt {attempt_id} not placed: {errors}"

    def close(self) -> None:
        self.stop_hub()
        server = self._server
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
        with self.ctx.session() as session:
            for workspace in workspaces.live_workspaces(session):
                workspaces.destroy(session, workspace, factory)

    # -- helpers ----------------------------------------------------------------------------

    def hub_url(self, path: str) -> str:
        assert self.config is not None
        return self.config.public_url + path

    def service_headers(self) -> dict[str, str]:
        assert self.config is not None
        return {"Authorization": f"token {self.config.service_token()}"}

    def portal_login(self, who: Participant) -> requests.Session:
        browser = requests.Session()
        page = browser.get(self.portal_url + "/login").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        done = browser.post(
            self.portal_url + "/login",
            data={"email": who.email, "password": PASSWORD, "csrf_token": token.group(1)},
            allow_redirects=False,
        )
        assert done.status_code == 302, done.text
        return browser

    def open_workspace(self, browser: requests.Session, who: Participant) -> requests.Response:
        page = browser.get(f"{self.portal_url}/attempts/{who.attempt_id}").text
        assert 'id="open-workspace"' in page
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        landed = browser.post(
            f"{self.portal_url}/attempts/{who.attempt_id}/workspace",
            data={"csrf_token": token.group(1)},
            timeout=120,
        )
        # The work page: its frame opens JupyterLab through the hub's one-time login, as a
        # browser loads it.
        frame = re.search(r'<iframe id="lab" src="([^"]+)"', landed.text)
        if landed.status_code != 200 or frame is None:
            return landed
        return browser.get(html.unescape(frame.group(1)), timeout=120)

    def wait_ready(self, who: Participant, timeout: float = 120) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = requests.get(
                self.hub_url(f"/hub/api/users/{who.hub_user}"),
                headers=self.service_headers(),
                timeout=10,
            )
            if answer.status_code == 200:
                server = answer.json().get("servers", {}).get(who.server)
                if server and server.get("ready"):
                    return dict(server)
            time.sleep(0.5)
        pytest.fail(f"server {who.hub_user}/{who.server} never became ready:\n{self.hub_log()}")

    def snapshot_files(self, who: Participant) -> dict[str, bytes]:
        """Take a manual snapshot now and return its files by path."""
        from baseline.attempts import attempts

        taken = attempts.manual_snapshot(self.ctx, who.attempt_id, None, snapshots.resolve_source)
        with (
            self.ctx.session() as session,
            snapshots.snapshot_tar(session, snapshots.store_for(self.ctx), taken.id) as tar,
        ):
            data = tar.read()
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is not None:
                    files[member.name.removeprefix("./").removeprefix("submission/")] = (
                        extracted.read()
                    )
        return files

    def workspace_file(self, who: Participant, name: str) -> bytes:
        """A file of the submission as the container has it now (empty when absent).

        Read as root: a pause's hold SIGSTOPs every process of the workspace user for its
        rounds, and a `cat` run as that user in the meantime would be stopped with them (the
        test then hung in this read until its 600 s timeout)."""
        with self.ctx.session() as session:
            workspace = session.scalars(
                select(Workspace).where(Workspace.attempt_id == who.attempt_id)
            ).one()
            container = workspace.name
        done = subprocess.run(
            ["docker", "exec", "-u", "root", container, "cat", f"/home/submission/{name}"],
            capture_output=True,
            check=False,
            timeout=60,
        )
        return done.stdout if done.returncode == 0 else b""

    def workspace_processes(self, who: Participant) -> str:
        with self.ctx.session() as session:
            workspace = session.scalars(
                select(Workspace).where(Workspace.attempt_id == who.attempt_id)
            ).one()
            container = workspace.name
        done = subprocess.run(
            ["docker", "exec", "-u", "root", container, "ps", "-eo", "pid,args"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return done.stdout

    def restart_workspace(self, who: Participant) -> None:
        """What Baseline does to a workspace whose container stopped: start it again."""
        with self.ctx.session() as session:
            workspace = session.scalars(
                select(Workspace).where(Workspace.attempt_id == who.attempt_id)
            ).one()
            subprocess.run(["docker", "stop", "-t", "1", workspace.name], check=True)
            workspaces.restart(session, workspace, factory)

    def server_state(self, who: Participant) -> dict[str, object] | None:
        answer = requests.get(
            self.hub_url(f"/hub/api/users/{who.hub_user}"),
            headers=self.service_headers(),
            timeout=10,
        )
        answer.raise_for_status()
        found = answer.json().get("servers", {}).get(who.server)
        return dict(found) if found else None

    def attempt(self, who: Participant) -> Attempt:
        with self.ctx.session() as session:
            attempt = session.get(Attempt, who.attempt_id)
            assert attempt is not None
            list(attempt.pauses)  # loaded before the session closes
            session.expunge_all()
            return attempt


# The fixtures of a test module that uses a HubWorld: import them by name into the module (and
# list them in its __all__). SQLite only: the hub's path does not depend on the database engine,
# and these tests are slow.


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    return Settings(home=home, database_url=database_url, secret_key="hub", extra=hub_extra())


@pytest.fixture
def world(ctx: Context, app: Flask, test_image: str) -> Iterator[HubWorld]:
    docker_url("unix")
    require_jupyter_image(test_image)
    hub_world = HubWorld(ctx=ctx, app=app, image=test_image, home=ctx.settings.home)
    try:
        hub_world.start_portal()
        hub_world.start_hub()
        yield hub_world
    finally:
        hub_world.close()
