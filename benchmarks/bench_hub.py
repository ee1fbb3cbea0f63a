"""Portal login to JupyterLab ready, against a plain JupyterHub spawn measured in the same run.

Ours: a participant logs into the portal, "Open workspace" (one-time token, hub login, spawn in
the attempt's existing container through the docker-exec tunnel), until JupyterLab's page is
served. Plain: a stock JupyterHub (DummyAuthenticator, SimpleLocalProcessSpawner whose command is
``docker run --network host IMAGE jupyterhub-singleuser``: a container per spawn, as DockerSpawner
does) from its login form until the same page is served. Same image, same proxy, same machine.
Each run stops the server first; the median of --runs is reported with the ratio (goal <= 1.5).

Usage: .venv/bin/python benchmarks/bench_hub.py [--runs 3] [--image TAG]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests

from app import create_app
from baseline import migrate
from baseline.config import Settings
from baseline.context import Context
from tests.docker_env import workspace_image
from tests.hub_world import HubWorld, Participant, free_port, hub_extra

BENCH_LABEL = "baseline.bench=hub"
ENV_KEYS = [
    "JUPYTERHUB_API_TOKEN",
    "JPY_API_TOKEN",
    "JUPYTERHUB_CLIENT_ID",
    "JUPYTERHUB_HOST",
    "JUPYTERHUB_OAUTH_CALLBACK_URL",
    "JUPYTERHUB_OAUTH_SCOPES",
    "JUPYTERHUB_OAUTH_ACCESS_SCOPES",
    "JUPYTERHUB_OAUTH_CLIENT_ALLOWED_SCOPES",
    "JUPYTERHUB_USER",
    "JUPYTERHUB_SERVER_NAME",
    "JUPYTERHUB_API_URL",
    "JUPYTERHUB_ACTIVITY_URL",
    "JUPYTERHUB_BASE_URL",
    "JUPYTERHUB_SERVICE_PREFIX",
    "JUPYTERHUB_SERVICE_URL",
    "JUPYTERHUB_PUBLIC_URL",
    "JUPYTERHUB_PUBLIC_HUB_URL",
    "JUPYTERHUB_ROOT_DIR",
    "JUPYTERHUB_DEFAULT_URL",
    "JUPYTERHUB_COOKIE_HOST_PREFIX_ENABLED",
]


def lab_ready(session: requests.Session, url: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    answer = None
    while time.monotonic() < deadline:
        answer = session.get(url, timeout=30)
        if (
            answer.status_code == 200
            and answer.url.endswith("/lab")
            and "JupyterLab" in answer.text
        ):
            return
        time.sleep(0.2)
    seen = f"{answer.status_code} at {answer.url}" if answer is not None else "nothing"
    raise RuntimeError(f"{url} never served JupyterLab (last: {seen})")


def wait_stopped(hub: str, headers: dict[str, str], user: str, server: str) -> None:
    path = (
        f"{hub}/hub/api/users/{user}/servers/{server}"
        if server
        else f"{hub}/hub/api/users/{user}/server"
    )
    requests.delete(path, headers=headers, timeout=60)
    for _ in range(120):
        info = requests.get(f"{hub}/hub/api/users/{user}", headers=headers, timeout=10).json()
        if not info.get("servers", {}).get(server):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{user}/{server} did not stop")


def ours(world: HubWorld, me: Participant, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        browser = world.portal_login(me)
        landed = world.open_workspace(browser, me)
        landed.raise_for_status()
        lab_ready(browser, world.hub_url(f"/user/{me.hub_user}/{me.server}/lab"))
        times.append(time.perf_counter() - started)
        wait_stopped(world.hub_url(""), world.service_headers(), me.hub_user, me.server)
    return times


def plain_config(home: Path, image: str, proxy: str, token: str) -> tuple[Path, str]:
    port, hub_port, api_port = free_port(), free_port(), free_port()
    cmd = ["docker", "run", "--rm", "--network", "host", "--label", BENCH_LABEL]
    for key in ENV_KEYS:
        cmd += ["-e", key]
    cmd += [image, "jupyterhub-singleuser"]
    text = "\n".join(
        [
            "c = get_config()  # noqa: F821",
            f"c.JupyterHub.ip = '127.0.0.1'; c.JupyterHub.port = {port}",
            f"c.JupyterHub.hub_ip = '127.0.0.1'; c.JupyterHub.hub_port = {hub_port}",
            f"c.JupyterHub.db_url = 'sqlite:///{home}/plain.sqlite'",
            f"c.JupyterHub.cookie_secret_file = '{home}/plain_cookie_secret'",
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{api_port}'",
            f"c.ConfigurableHTTPProxy.command = [{proxy!r}]",
            f"c.ConfigurableHTTPProxy.auth_token = {secrets.token_hex(16)!r}",
            f"c.ConfigurableHTTPProxy.pid_file = '{home}/plain_proxy.pid'",
            "c.JupyterHub.authenticator_class = 'dummy'",
            "c.DummyAuthenticator.password = 'bench-password'",
            "c.Authenticator.allow_all = True",
            "c.JupyterHub.spawner_class = 'simple'",
            f"c.Spawner.cmd = {cmd!r}",
            "c.Spawner.notebook_dir = '/home/submission'",
            "c.Spawner.default_url = '/lab'",
            "c.Spawner.start_timeout = 120",
            f"c.JupyterHub.services = [{{'name': 'bench', 'api_token': {token!r}}}]",
            "c.JupyterHub.load_roles = [{'name': 'bench', 'scopes': ['admin:servers', "
            "'admin:users'], 'services': ['bench']}]",
        ]
    )
    path = home / "plain_config.py"
    path.write_text(text + "\n")
    return path, f"http://127.0.0.1:{port}"


def plain(home: Path, image: str, proxy: str, runs: int) -> list[float]:
    token = secrets.token_hex(16)
    config, hub = plain_config(home, image, proxy, token)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(config)],
        cwd=home,
        stdout=open(home / "plain.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    headers = {"Authorization": f"token {token}"}
    try:
        for _ in range(180):
            try:
                if requests.get(f"{hub}/hub/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            browser = requests.Session()
            browser.get(f"{hub}/hub/login", timeout=30)
            browser.post(
                f"{hub}/hub/login?next=/hub/spawn/bench",
                data={
                    "username": "bench",
                    "password": "bench-password",
                    "_xsrf": browser.cookies.get("_xsrf", ""),
                },
                timeout=120,
            ).raise_for_status()
            lab_ready(browser, f"{hub}/user/bench/lab")
            times.append(time.perf_counter() - started)
            wait_stopped(hub, headers, "bench", "")
        return times
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image", default=os.environ.get("BASELINE_TEST_IMAGE") or None)
    args = parser.parse_args()
    image = args.image or workspace_image()
    with tempfile.TemporaryDirectory(prefix="bench-hub-") as tmp:
        home = Path(tmp)
        extra = hub_extra()
        settings = Settings(
            home=home, database_url=f"sqlite:///{home / 'b.db'}", secret_key="b", extra=extra
        )
        migrate.upgrade(settings.database_url)
        ctx = Context.from_settings(settings)
        world = HubWorld(ctx=ctx, app=create_app(context=ctx), image=image, home=home)
        try:
            world.start_portal()
            world.start_hub()
            world.add_participants(1)
            ours_s = ours(world, world.participants[0], args.runs)
        finally:
            world.close()
        try:
            plain_s = plain(home, image, str(extra["hub_proxy_cmd"]), args.runs)
        finally:
            subprocess.run(
                f"docker ps -aq --filter label={BENCH_LABEL} | xargs -r docker rm -f",
                shell=True,
                check=False,
                capture_output=True,
            )
    a, b = statistics.median(ours_s), statistics.median(plain_s)
    print(f"portal login -> JupyterLab ready (ours):  median {a:.2f} s  runs {ours_s}")
    print(f"plain JupyterHub login -> JupyterLab:      median {b:.2f} s  runs {plain_s}")
    print(f"ratio ours / plain: {a / b:.2f}  (goal <= 1.5)")


if __name__ == "__main__":
    main()
