"""The generated hub config, Baseline's hub settings, `baseline hub --print-config`, the tunnel."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from baseline.config import ConfigError, Settings
from baseline.hub_settings import hub_config, hub_managed
from baseline.runs.command_agents import RELAY_PORT
from infra.hub.channel import TUNNEL_SOURCE
from infra.hub.config import (
    HUB_API_PORT_INSIDE,
    SINGLEUSER_PORT,
    record_started,
    render,
    write_config,
)
from infra.hub.spawner import ONE_PORT, launch_script
from infra.hub.tunnel import Mux
from infra.listen_ports import PortInUse
from tests.ports import free_port


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(home=tmp_path, database_url="sqlite://", secret_key="k", extra=dict(extra))


def test_another_process_reaches_the_hub_started_here_with_its_settings(tmp_path: Path) -> None:
    """Issue 39 item 5: `baseline serve` (or the demo) started the hub on other ports than the
    defaults; the CLI in another shell, given none of those settings, reaches that hub."""
    served = {
        "BASELINE_HUB_PORT": "9110",
        "BASELINE_HUB_API_PORT": "9111",
        "BASELINE_HUB_PROXY_API_PORT": "9112",
        "BASELINE_HUB_PORTAL_URL": "http://127.0.0.1:9100",
    }
    started = hub_config(_settings(tmp_path), served, starting=True)
    record_started(started)

    cli = hub_config(_settings(tmp_path), {})

    assert (cli.public_url, cli.port, cli.hub_port, cli.proxy_api_port, cli.portal_url) == (
        "http://127.0.0.1:9110",
        9110,
        9111,
        9112,
        "http://127.0.0.1:9100",
    )
    assert cli.service_token_file == started.service_token_file
    # Settings given explicitly win over the note, and a process starting a hub takes its own.
    mine = hub_config(_settings(tmp_path), {"BASELINE_HUB_PORT": "9200"})
    assert (mine.port, mine.public_url, mine.hub_port) == (9200, "http://127.0.0.1:9200", 9111)
    assert hub_config(_settings(tmp_path, hub_api_port=9300), {}).hub_port == 9300
    assert hub_config(_settings(tmp_path), {}, starting=True).port == 8010
    # An unreadable note is no note.
    started.started_file.write_text("{not json")
    assert hub_config(_settings(tmp_path), {}).port == 8010


def test_config_from_settings_keeps_secrets_out_of_the_file(tmp_path: Path) -> None:
    config = hub_config(_settings(tmp_path, hub_port=9100), {"BASELINE_HUB_API_PORT": "9101"})
    assert (config.port, config.hub_port, config.public_url) == (
        9100,
        9101,
        "http://127.0.0.1:9100",
    )
    path = write_config(config)
    text = path.read_text()
    assert "c.JupyterHub.cleanup_servers = False" in text
    assert f"sqlite:///{tmp_path / 'hub' / 'jupyterhub.sqlite'}" in text
    assert config.service_token() not in text  # read from its 0600 file at hub start
    assert oct(config.service_token_file.stat().st_mode & 0o777) == "0o600"
    compile(render(config), str(path), "exec")
    assert "allow_token_in_url" not in text  # JupyterHub 5's refusal of ?token= is kept


def test_bad_hub_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="BASELINE_HUB_PORT"):
        hub_config(_settings(tmp_path), {"BASELINE_HUB_PORT": "http"})
    with pytest.raises(ConfigError, match="BASELINE_HUB_MANAGED"):
        hub_managed(_settings(tmp_path), {"BASELINE_HUB_MANAGED": "perhaps"})
    assert hub_managed(_settings(tmp_path), {}) is True
    assert hub_managed(_settings(tmp_path, hub_managed="false"), {}) is False


def test_cli_prints_the_generated_config(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "baseline", "hub", "--print-config"],
        env={
            "BASELINE_HOME": str(tmp_path),
            "BASELINE_HUB_PROXY_CMD": sys.executable,  # any existing file will do here
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "c.JupyterHub.spawner_class = 'infra.hub.spawner.WorkspaceSpawner'" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "baseline", "hub"],
        env={"BASELINE_HOME": str(tmp_path), "BASELINE_HUB_PROXY_CMD": "/nonexistent/chp"},
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: configurable-http-proxy not found")


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1024):
            w.write(b"echo:" + data)
            await w.drain()
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _roundtrip(port: int, payload: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(payload)
    await w.drain()
    try:
        return await asyncio.wait_for(r.read(1024), 10)
    finally:
        w.close()


def test_tunnel_forwards_both_ways_and_refuses_other_ports() -> None:
    """The container side runs as a separate `python3 -c` process, as inside a workspace."""

    async def scenario() -> None:
        inside, inside_port = await _echo_server()  # "the single-user server"
        hub, hub_port = await _echo_server()  # "the hub's API"
        other, other_port = await _echo_server()  # any other host service
        hub_in, other_in = free_port(), free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            TUNNEL_SOURCE,
            f"{hub_in}:{hub_port}",
            f"{other_in}:{other_port}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdin is not None
        mux = Mux(proc.stdout, proc.stdin, 0, frozenset({hub_port}))
        host_port = await mux.listen(0, inside_port)  # the port its own bind took
        task = asyncio.ensure_future(mux.run())
        await asyncio.sleep(0.5)  # the container side binds its listeners
        try:
            assert await _roundtrip(host_port, b"to the server") == b"echo:to the server"
            assert await _roundtrip(hub_in, b"to the hub") == b"echo:to the hub"
            assert await _roundtrip(other_in, b"elsewhere") == b""  # closed, not forwarded
        finally:
            proc.kill()
            await proc.wait()
            await asyncio.wait_for(task, 10)
            for server in (inside, hub, other):
                server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("port", [SINGLEUSER_PORT, HUB_API_PORT_INSIDE, RELAY_PORT])
def test_ports_inside_a_workspace_are_below_the_ephemeral_range(port: int) -> None:
    """A spawn hung for 90 s: the tunnel connects to the server's port inside the container
    again and again while the server starts, and one connection was given that same port as its
    source and connected to itself (the hub read its own request back; the server could not bind
    the port). The kernel never picks a source port outside its ephemeral range, so each port
    something in the workspace listens on lies below it, and the server never takes another."""
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert port < min(low, 32768)  # the kernel's default, a new container's namespace's
    assert ONE_PORT in launch_script("http://portal.example")


def test_the_hub_and_its_servers_may_be_framed_by_the_portal_only(tmp_path: Path) -> None:
    """Issue 39 item 6: the portal's work page frames JupyterLab; JupyterHub's default
    (``frame-ancestors 'none'``) refuses every framer, so the hub's pages and each single-user
    server name the portal's origin, and no other site."""
    from traitlets.config import Config

    from infra.hub.spawner import launch_script

    config = hub_config(_settings(tmp_path, hub_portal_url="http://portal.example:9100/"))
    expected = {"Content-Security-Policy": "frame-ancestors 'self' http://portal.example:9100"}
    loaded = Config()
    exec(write_config(config).read_text(), {"get_config": lambda: loaded})
    assert loaded.JupyterHub.tornado_settings == {"headers": expected}
    words = shlex.split(launch_script(config.portal_url))
    framing = [w for w in words if w.startswith("--ServerApp.tornado_settings=")]
    assert len(framing) == 1
    assert json.loads(framing[0].split("=", 1)[1]) == {"headers": expected}


@pytest.mark.parametrize(
    ("taken", "said"),
    [
        ("port", "JupyterHub's port {} on 127.0.0.1 is in use (another Baseline portal's or "
         "demo's hub?): free it, or set BASELINE_HUB_PORT"),
        ("hub_port", "JupyterHub's API port {} on 127.0.0.1 is in use"),
        ("proxy_api_port", "JupyterHub's proxy API port {} on 127.0.0.1 is in use"),
    ],
)  # fmt: skip
def test_a_taken_hub_port_is_said_before_the_hub_starts(
    tmp_path: Path, taken: str, said: str
) -> None:
    """The proxy failed to listen on a taken port and the hub ran on without it: the portal said
    "JupyterHub on ..." and no participant reached JupyterLab."""
    ports = {"port": free_port(), "hub_port": free_port(), "proxy_api_port": free_port()}
    config = hub_config(
        _settings(tmp_path),
        {
            "BASELINE_HUB_PORT": str(ports["port"]),
            "BASELINE_HUB_API_PORT": str(ports["hub_port"]),
            "BASELINE_HUB_PROXY_API_PORT": str(ports["proxy_api_port"]),
        },
        starting=True,
    )
    config.check_ports()  # all free
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[taken]))
        holder.listen()
        with pytest.raises(PortInUse, match=re.escape(said.format(ports[taken]))):
            config.check_ports()
