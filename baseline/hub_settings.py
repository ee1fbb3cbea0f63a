"""JupyterHub settings from Baseline's own configuration, with embedded defaults.

Each `BASELINE_HUB_*` environment variable (or `hub_*` key of the BASELINE_CONFIG file) overrides
one default; the hub's database, secrets and generated config live under ``$BASELINE_HOME/hub``.
`hub_managed` (default true) makes `baseline serve` start and supervise the hub; set it false to
point the portal at a hub run elsewhere (`baseline hub`, or another machine) via `hub_public_url`.
"""

from __future__ import annotations

import functools
import os
import shutil

from baseline.config import ConfigError, Settings, yes_or_no
from infra.hub.config import HubConfig, read_started

# The settings whose value the hub started last in this home notes (`infra.hub.config`), by the
# HubConfig field each one sets. Its public URL is taken only with its port (below).
_NOTED = {
    "hub_portal_url": "portal_url",
    "hub_ip": "ip",
    "hub_port": "port",
    "hub_api_port": "hub_port",
    "hub_proxy_api_port": "proxy_api_port",
}


def _pick(
    settings: Settings, env: dict[str, str], name: str, default: str, noted: dict[str, str]
) -> str:
    env_name = f"BASELINE_{name.upper()}"
    if env_name in env:
        return env[env_name]
    value = settings.extra.get(name)
    if value is not None:
        return str(value)
    return noted.get(_NOTED.get(name, ""), default)


def _port(
    settings: Settings, env: dict[str, str], name: str, default: int, noted: dict[str, str]
) -> int:
    raw = _pick(settings, env, name, str(default), noted)
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"BASELINE_{name.upper()}: not a port number: {raw!r}")
    return int(raw)


def hub_config(
    settings: Settings, environ: dict[str, str] | None = None, *, starting: bool = False
) -> HubConfig:
    """The hub's settings: each from its environment variable, else the configuration file,
    else (unless `starting` the hub) what the hub started last in this home noted, else the
    default. So the CLI run in another shell reaches the hub `baseline serve` (or the demo, whose
    hub ports follow its portal's) started, without being given the same settings; the process
    that starts a hub takes its own settings, not the last one's."""
    env = dict(os.environ if environ is None else environ)
    noted = {} if starting else read_started(settings.home / "hub")
    pick = functools.partial(_pick, settings, env, noted=noted)
    port = _port(settings, env, "hub_port", 8010, noted)
    port_set = "BASELINE_HUB_PORT" in env or settings.extra.get("hub_port") is not None
    noted_url = None if port_set else noted.get("public_url")
    ip = pick("hub_ip", "127.0.0.1")
    proxy_cmd = pick(
        "hub_proxy_cmd",
        shutil.which("configurable-http-proxy") or "configurable-http-proxy",
    )
    return HubConfig(
        data_dir=settings.home / "hub",
        portal_url=pick("hub_portal_url", "http://127.0.0.1:8000"),
        public_url=pick("hub_public_url", noted_url or f"http://127.0.0.1:{port}").rstrip("/"),
        ip=ip,
        port=port,
        hub_port=_port(settings, env, "hub_api_port", 8011, noted),
        proxy_api_port=_port(settings, env, "hub_proxy_api_port", 8012, noted),
        proxy_cmd=proxy_cmd,
        poll_interval_s=_port(settings, env, "hub_poll_interval", 30, noted),
    )


def hub_managed(settings: Settings, environ: dict[str, str] | None = None) -> bool:
    env = dict(os.environ if environ is None else environ)
    return yes_or_no("BASELINE_HUB_MANAGED", _pick(settings, env, "hub_managed", "true", {}))
