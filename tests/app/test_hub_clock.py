"""The clock follows the human in the hub: idle auto-pause, hub outage, the time limit.

Real portal, hub, proxy and Docker workspace (`tests.hub_world`); kernels are driven through the
single-user server's own REST and websocket API, as JupyterLab drives them. Time-scaled: the
attempt's time scale makes one idle working minute two wall seconds.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from datetime import datetime

import pytest
import requests
from sqlalchemy import select
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from baseline.attempts import schedule, snapshots
from baseline.hub import hub_watch
from baseline.hub_settings import hub_config
from baseline.models import Attempt, PauseReason, Study, Workspace, utcnow
from tests.app.test_hub import _login_and_open, _put_file
from tests.docker_env import test_image
from tests.hub_world import HubWorld, Participant, database_url, settings, world

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["database_url", "settings", "test_image", "world"]

TIME_SCALE = 30.0  # one idle working minute is two wall seconds
IDLE_WAIT_S = 2.6


def _server_api(world: HubWorld, who: Participant, path: str) -> str:
    return world.hub_url(f"/user/{who.hub_user}/{who.server}/api/{path}")


def _start_kernel(world: HubWorld, who: Participant) -> str:
    made = requests.post(
        _server_api(world, who, "kernels"), headers=world.service_headers(), timeout=60
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"])  # started; it answers once a client connects (`_execute`)


def _execute(world: HubWorld, who: Participant, kernel: str, code: str) -> None:
    """Send one execute_request over the kernel's websocket, as JupyterLab does; return once
    the kernel has taken it (busy), without waiting for it to finish."""
    url = _server_api(world, who, f"kernels/{kernel}/channels").replace("http://", "ws://")

    async def send() -> None:
        request = HTTPRequest(url, headers=world.service_headers())
        connection = await websocket_connect(request)
        message_id = uuid.uuid4().hex
        await connection.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": message_id,
                        "msg_type": "execute_request",
                        "username": who.hub_user,
                        "session": uuid.uuid4().hex,
                        "version": "5.3",
                        "date": utcnow().isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(connection.read_message(), 90)
            assert raw is not None, "kernel websocket closed"
            message = json.loads(raw)
            if (
                message.get("parent_header", {}).get("msg_id") == message_id
                and message["header"]["msg_type"] == "status"
                and message["content"]["execution_state"] == "busy"
            ):
                connection.close()
                return
        pytest.fail("the kernel never took the request")

    asyncio.run(send())


def _wait_kernel_idle(world: HubWorld, who: Participant, kernel: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = requests.get(
            _server_api(world, who, f"kernels/{kernel}") + "?no_track_activity=1",
            headers=world.service_headers(),
        ).json()["execution_state"]
        if state == "idle":
            return
        time.sleep(0.3)
    pytest.fail("kernel still busy")


def _set(world: HubWorld, who: Participant, idle_minutes: float | None) -> None:
    with world.ctx.session() as session:
        attempt = session.get(Attempt, who.attempt_id)
        assert attempt is not None
        attempt.time_scale = TIME_SCALE
        study = session.get(Study, attempt.study_id)
        assert study is not None
        study.idle_pause_minutes = idle_minutes


def _watch(world: HubWorld) -> hub_watch.WatchReport:
    with world.ctx.session() as session:
        return hub_watch.watch(session, hub_config(world.ctx.settings))


def _observe(world: HubWorld, who: Participant) -> hub_watch.Activity:
    config = hub_config(world.ctx.settings)
    with world.ctx.session() as session:
        attempt = session.get(Attempt, who.attempt_id)
        assert attempt is not None
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == who.attempt_id)
        ).one()
        return hub_watch.observe(config, session, attempt, workspace)


def _open_pause(world: HubWorld, who: Participant) -> tuple[PauseReason, datetime, str] | None:
    attempt = world.attempt(who)
    for pause in attempt.pauses:
        if pause.ended_at is None:
            return pause.reason, pause.started_at, pause.note
    return None


def test_idle_auto_pause_on_and_off_and_hub_outage(world: HubWorld) -> None:
    world.add_participants(1)
    (me,) = world.participants
    browser = _login_and_open(world, me)
    kernel = _start_kernel(world, me)

    # Off (the default): however long nothing happens, the clock runs.
    _set(world, me, None)
    time.sleep(IDLE_WAIT_S)
    assert _watch(world).idle_paused == [] and _open_pause(world, me) is None

    # On: a busy kernel that prints nothing is activity, though the server saw nothing lately.
    _set(world, me, 1.0)
    _execute(world, me, kernel, "import time\ntime.sleep(25)")
    time.sleep(IDLE_WAIT_S)
    seen = _observe(world, me)
    assert seen.busy_kernels == 1
    assert seen.last_activity is not None
    assert (utcnow() - seen.last_activity).total_seconds() > IDLE_WAIT_S - 0.5
    assert _watch(world).idle_paused == [] and _open_pause(world, me) is None

    # So is a process the participant left running in the background (the kernel is idle).
    requests.post(
        _server_api(world, me, f"kernels/{kernel}/interrupt"), headers=world.service_headers()
    )
    _wait_kernel_idle(world, me, kernel)
    _execute(
        world,
        me,
        kernel,
        "import subprocess\nbg = subprocess.Popen(['sleep', '300'], start_new_session=True)",
    )
    _wait_kernel_idle(world, me, kernel)
    time.sleep(IDLE_WAIT_S)
    seen = _observe(world, me)
    assert seen.busy_kernels == 0 and any("sleep 300" in p for p in seen.work_processes), seen
    assert _watch(world).idle_paused == [] and _open_pause(world, me) is None

    # Nothing running, nothing done for the idle minutes: an `idle` pause.
    _execute(world, me, kernel, "bg.kill(); bg.wait()")
    _wait_kernel_idle(world, me, kernel)
    time.sleep(IDLE_WAIT_S)
    assert _observe(world, me).work_processes == ()
    assert _watch(world).idle_paused == [me.attempt_id]
    paused = _open_pause(world, me)
    assert paused is not None and paused[0] is PauseReason.IDLE
    assert world.attempt(me).status.value == "paused"
    assert _watch(world).idle_paused == []  # one pause, not one per round

    # The next activity in JupyterLab resumes the clock, at that activity's time.
    assert _put_file(world, browser, me, "back.txt", "back\n").status_code in (200, 201)
    report = _watch(world)
    assert report.idle_resumed == [me.attempt_id]
    assert _open_pause(world, me) is None
    ended = [p for p in world.attempt(me).pauses if p.reason is PauseReason.IDLE]
    assert len(ended) == 1 and ended[0].ended_at is not None
    assert ended[0].started_at <= ended[0].ended_at <= utcnow()
    # Nothing was culled: the kernel lives on, in the same server.
    kernels = requests.get(_server_api(world, me, "kernels"), headers=world.service_headers())
    assert kernel in [k["id"] for k in kernels.json()]

    # The hub goes down: the participant cannot reach the workspace, the clock pauses (outage),
    # the portal says so; it resumes when the hub answers again.
    _set(world, me, None)
    world.stop_hub()
    down = _watch(world)
    assert not down.hub_up and down.outage_paused == [me.attempt_id]
    paused = _open_pause(world, me)
    assert paused is not None and paused[0] is PauseReason.OUTAGE
    assert paused[2].startswith(hub_watch.HUB_OUTAGE_NOTE)
    refused = world.open_workspace(world.portal_login(me), me)
    assert refused.status_code == 409 and "JupyterHub is not answering" in refused.text
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    assert "reason: outage" in page
    world.start_hub()
    assert _watch(world).outage_resumed == [me.attempt_id]
    assert _open_pause(world, me) is None


def test_time_limit_reached_while_a_kernel_is_busy(world: HubWorld) -> None:
    world.add_participants(1)
    (me,) = world.participants
    browser = _login_and_open(world, me)
    kernel = _start_kernel(world, me)
    _execute(
        world,
        me,
        kernel,
        "open('train.log', 'w').write('epoch 1\\n')\nimport time\ntime.sleep(600)",
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not world.workspace_file(me, "train.log"):
        time.sleep(0.5)
    assert world.workspace_file(me, "train.log") == b"epoch 1\n"

    # The working-time limit falls due now, with the kernel still busy.
    with world.ctx.session() as session:
        attempt = session.get(Attempt, me.attempt_id)
        assert attempt is not None
        attempt.working_time_limit_s = 1.0
    schedule.run_due(world.ctx, me.attempt_id, snapshots.resolve_source)

    attempt = world.attempt(me)
    assert attempt.status.value == "ended" and attempt.end_reason == "working-time limit reached"
    # The final snapshot has what the busy kernel had written.
    with world.ctx.session() as session:
        ended = session.get(Attempt, me.attempt_id)
        assert ended is not None
        final = [s for s in ended.snapshots if s.kind.value == "final"]
        assert len(final) == 1
        with snapshots.snapshot_tar(session, snapshots.store_for(world.ctx), final[0].id) as tar:
            data = tar.read()
    assert b"epoch 1\n" in data
    # The server is stopped, the kernel with it, and nothing of the participant's runs.
    assert not (world.server_state(me) or {}).get("ready")
    processes = world.workspace_processes(me)
    assert "jupyterhub-singleuser" not in processes and "ipykernel" not in processes
    # The workspace is frozen read-only: the participant can no longer change the submission.
    with world.ctx.session() as session:
        container = (
            session.scalars(select(Workspace).where(Workspace.attempt_id == me.attempt_id))
            .one()
            .name
        )
    tried = subprocess.run(
        ["docker", "exec", "-u", "participant", container, "sh", "-c", "echo x >> train.log"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tried.returncode != 0 and "Permission denied" in tried.stderr
    assert world.workspace_file(me, "train.log") == b"epoch 1\n"
    # The participant sees why: on the attempt page, and from the hub if they try to go back.
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    assert "working-time limit reached" in page and "read-only" in page
    # Issue 39 item 6: the open JupyterLab, reloaded, says the attempt has ended, not "Launch".
    lab = browser.get(world.hub_url(f"/user/{me.hub_user}/{me.server}/lab"), timeout=60)
    assert lab.status_code == 424 and 'id="workspace-not-running"' in lab.text, lab.text[-2000:]
    assert "attempt has ended" in lab.text and 'id="back-to-portal"' in lab.text
    assert "Launch" not in lab.text
    again = browser.get(world.hub_url(f"/hub/spawn/{me.hub_user}/{me.server}"), timeout=60)
    deadline = time.monotonic() + 30  # a slow refusal is shown on the spawn-pending page
    while again.status_code < 400 and time.monotonic() < deadline:
        time.sleep(1)
        again = browser.get(world.hub_url(f"/hub/spawn-pending/{me.hub_user}/{me.server}"))
    assert again.status_code == 409
    assert "working-time limit reached" in again.text, again.text[-2000:]
