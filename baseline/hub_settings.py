"""JupyterHub settings from Baseline's own configuration, with embedded defaults.

Each `BASELINE_HUB_*` environment variable (or `hub_*` key of the BASELINE_CONFIG file) overrides
one default; the hub's database, secrets and generated config live under ``$BASELINE_HOME/hub``.
`hub_managed` (default true) makes `baseline serve` start and supervise the hub; set it false to
point the portal at a hub run elsewhere (`baseline hub`, or another machine) via `hub_public_url`.
"""

from __future__ import annotations

import os
import shutil

from baseline.config import ConfigError, Settings
from infra.hub.config import HubConfig


def _pick(settings: Settings, env: dict[str, str], name: str, default: str) -> str:
    env_name = f"BASELINE_{name.upper()}"
    if env_name in env:
        return env[env_name]
    value = settings.extra.get(name)
    return default if value is None else str(value)


def _port(settings: Settings, env: dict[str, str], name: str, default: int) -> int:
    raw = _pick(settings, env, name, str(default))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"BASELINE_{name.upper()}: not a port number: {raw!r}")
    return int(raw)


def hub_config(settings: Settings, environ: dict[str, str] | None = None) -> HubConfig:
    env = dict(os.environ if environ is None else environ)
    port = _port(settings, env, "hub_port", 8010)
    ip = _pick(settings, env, "hub_ip", "127.0.0.1")
    proxy_cmd = _pick(
        settings,
        env,
        "hub_proxy_cmd",
        shutil.which("configurable-http-proxy") or "configurable-http-proxy",
    )
    return HubConfig(
        data_dir=settings.home / "hub",
        portal_url=_pick(settings, env, "hub_portal_url", "http://127.0.0.1:8000"),
        public_url=_pick(settings, env, "hub_public_url", f"http://127.0.0.1:{port}").rstrip("/"),
        ip=ip,
        port=port,
        hub_port=_port(settings, env, "hub_api_port", 8011),
        proxy_api_port=_port(settings, env, "hub_proxy_api_port", 8012),
        proxy_cmd=proxy_cmd,
        poll_interval_s=_port(settings, env, "hub_poll_interval", 30),
    )


def hub_managed(settings: Settings, environ: dict[str, str] | None = None) -> bool:
    env = dict(os.environ if environ is None else environ)
    raw = _pick(settings, env, "hub_managed", "true").lower()
    if raw not in {"1", "true", "yes", "0", "false", "no"}:
        raise ConfigError(f"BASELINE_HUB_MANAGED: not a boolean: {raw!r}")
    return raw in {"1", "true", "yes"}
