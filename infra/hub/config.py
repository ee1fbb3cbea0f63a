"""The hub's generated ``jupyterhub_config.py`` and the process that runs it.

Baseline owns the hub's configuration: `render` turns a `HubConfig` (made from Baseline's settings
by `baseline.hub_settings`) into a config file, so that ports, secrets and the database location
have one source. Secrets are not written into the file: it reads them from their files (mode 0600
under the hub's directory) when the hub starts.

Choices that matter:
- ``cleanup_servers = False``: a hub restart reconnects to running single-user servers (the
  spawner's `poll` re-opens their tunnels and the hub re-adds their routes) instead of stopping
  them; Baseline, not the hub, owns a workspace's life.
- ``allow_all = True`` is safe here because the only way in is a login token the portal issued
  for the participant's own attempt (JupyterHub 5+ admits nobody without an allow rule).
- No ``?token=`` logins to single-user servers (JupyterHub 5's default is kept).
- Participants hold no hub API tokens of their own: the default ``user`` role is redefined without
  the ``tokens`` scope (`PARTICIPANT_SCOPES`), the Token page is refused
  (`infra.hub.authenticator`), and the portal's logout deletes the hub user
  (`infra.hub.hub_api.end_user`), which revokes what the hub issued them.
- The portal is a hub service with a shared token: the hub authenticates its calls with it, and
  the portal authenticates the hub's calls (redeem a login token, locate a workspace) with it.
  Its ``access:servers`` scope lets it read a server's activity and kernels (idle auto-pause).
- The hub's pages and every single-user server may be framed by the portal's origin only
  (`frame_ancestors`): the portal's work page shows JupyterLab under its own bar (the clock,
  pause, the paper, the end); JupyterHub's default, ``frame-ancestors 'none'``, would refuse it.
- No idle culler: no ``jupyterhub-idle-culler`` service, and the single-user server never culls
  its kernels or shuts itself down (see `infra.hub.spawner.NO_CULLING`). The hub's activity
  record misses busy but silent kernels, so a culler would kill training runs; Baseline instead
  pauses the clock of an idle workspace (`baseline.hub.hub_watch`) and stops a server only when its
  attempt ends.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from infra.listen_ports import PortInUse, is_free

SERVICE_NAME = "baseline-portal"
# Ports inside the workspace container, on its loopback only (see infra.hub.tunnel). Below the
# kernel's ephemeral range (32768-60999 in a container's own network namespace): the tunnel
# connects to the server's port again and again while the server starts, and a connection to an
# ephemeral port nobody listens on yet can be given that same port as its source and connect to
# itself (once in some thousands of tries), echoing the hub's request back to it and keeping the
# server from binding the port; the spawn then hung until the hub gave up on it.
SINGLEUSER_PORT = 18888
HUB_API_PORT_INSIDE = 18081
# The default `user` role, redefined: JupyterHub's `self` less `tokens` (no participant mints an
# API token that would outlive the portal session) and less sharing (nobody else is let into a
# workspace but through the portal's audited observe action).
PARTICIPANT_SCOPES = (
    "read:users!user",
    "users:activity!user",
    "servers!user",
    "access:servers!user",
)
# The hub's pages, Baseline's way: no Token or Stop links, every error page leads to the portal.
TEMPLATES = Path(__file__).resolve().parent / "templates"


class HubConfigError(RuntimeError):
    """The hub cannot be configured or started here; the message says what is missing."""


@dataclass(frozen=True)
class HubConfig:
    data_dir: Path  # database, cookie secret, pid files, generated config
    portal_url: str  # how the hub reaches the portal (server to server)
    public_url: str  # how browsers reach the hub's proxy
    ip: str = "127.0.0.1"
    port: int = 8010  # the proxy's public port
    hub_port: int = 8011  # the hub's own API / pages, behind the proxy
    proxy_api_port: int = 8012
    proxy_cmd: str = "configurable-http-proxy"
    poll_interval_s: int = 30  # how soon the hub notices a server gone with its workspace

    @property
    def service_token_file(self) -> Path:
        return self.data_dir / "service_token"

    @property
    def proxy_token_file(self) -> Path:
        return self.data_dir / "proxy_token"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "jupyterhub_config.py"

    @property
    def started_file(self) -> Path:
        return self.data_dir / STARTED_FILE

    def service_token(self) -> str:
        return _secret(self.service_token_file)

    def check_ports(self) -> None:
        """Raise `PortInUse` for the first of the hub's ports that is taken: its proxy failed
        to listen and the hub ran on without it, so that no participant reached JupyterLab."""
        why = "another Baseline portal's or demo's hub?"
        for host, port, what, setting in (
            (self.ip, self.port, "JupyterHub's port", "BASELINE_HUB_PORT"),
            ("127.0.0.1", self.hub_port, "JupyterHub's API port", "BASELINE_HUB_API_PORT"),
            ("127.0.0.1", self.proxy_api_port, "JupyterHub's proxy API port",
             "BASELINE_HUB_PROXY_API_PORT"),
        ):  # fmt: skip
            if not is_free(host, port):
                raise PortInUse(what, host, port, why, f"free it, or set {setting}")


def _secret(path: Path) -> str:
    """A random secret kept in a 0600 file, made on first use (survives restarts)."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return value


def frame_ancestors(portal_url: str) -> str:
    """The Content-Security-Policy of the hub's and the servers' pages: framed by themselves and
    by the portal's origin (its work page), by no other site."""
    url = urlsplit(portal_url)
    return f"frame-ancestors 'self' {url.scheme}://{url.netloc}"


def render(config: HubConfig) -> str:
    """The text of jupyterhub_config.py for this installation."""
    data = config.data_dir
    lines = [
        "# Generated by Baseline (infra/hub/config.py) from its settings: do not edit, it is",
        "# rewritten at every `baseline hub` / `baseline serve`.",
        "from pathlib import Path",
        "",
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.ip = {config.ip!r}",
        f"c.JupyterHub.port = {config.port}",
        "c.JupyterHub.hub_ip = '127.0.0.1'",
        f"c.JupyterHub.hub_port = {config.hub_port}",
        f"c.JupyterHub.db_url = {'sqlite:///' + str(data / 'jupyterhub.sqlite')!r}",
        f"c.JupyterHub.cookie_secret_file = {str(data / 'cookie_secret')!r}",
        "c.JupyterHub.cleanup_servers = False",
        "c.JupyterHub.allow_named_servers = True",
        "c.JupyterHub.named_server_limit_per_user = 0",
        "c.JupyterHub.redirect_to_server = False",
        "c.JupyterHub.authenticator_class = 'infra.hub.authenticator.PortalAuthenticator'",
        "c.JupyterHub.spawner_class = 'infra.hub.spawner.WorkspaceSpawner'",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{config.proxy_api_port}'",
        f"c.ConfigurableHTTPProxy.command = [{config.proxy_cmd!r}]",
        f"c.ConfigurableHTTPProxy.pid_file = {str(data / 'proxy.pid')!r}",
        f"c.ConfigurableHTTPProxy.auth_token = Path({str(config.proxy_token_file)!r})"
        ".read_text().strip()",
        f"_service_token = Path({str(config.service_token_file)!r}).read_text().strip()",
        "c.JupyterHub.services = [",
        f"    {{'name': {SERVICE_NAME!r}, 'api_token': _service_token}},",
        "]",
        "c.JupyterHub.load_roles = [",
        "    {",
        "        'name': 'baseline-portal',",
        "        'scopes': ['admin:users', 'admin:servers', 'read:users:activity',",
        "                   'access:servers'],",
        f"        'services': [{SERVICE_NAME!r}],",
        "    },",
        f"    {{'name': 'user', 'scopes': {list(PARTICIPANT_SCOPES)!r}}},",
        "]",
        f"c.JupyterHub.template_paths = [{str(TEMPLATES)!r}]",
        "c.JupyterHub.tornado_settings = {'headers': {'Content-Security-Policy': "
        f"{frame_ancestors(config.portal_url)!r}}}}}",
        f"c.JupyterHub.template_vars = {{'portal_url': {config.portal_url.rstrip('/')!r}}}",
        "c.Authenticator.allow_all = True",
        "c.Authenticator.auto_login = True",
        # Staff "observe" logins get a role for one server from the portal; participants' logins
        # carry no roles, so theirs are left as they are.
        "c.Authenticator.manage_roles = True",
        f"c.PortalAuthenticator.portal_url = {config.portal_url!r}",
        "c.PortalAuthenticator.service_token = _service_token",
        f"c.WorkspaceSpawner.portal_url = {config.portal_url!r}",
        "c.WorkspaceSpawner.service_token = _service_token",
        f"c.Spawner.hub_connect_url = 'http://127.0.0.1:{HUB_API_PORT_INSIDE}'",
        # Rooted at /home so that the paper (/home/paper, read-only) is in the file browser beside
        # the submission, which it opens in; terminals start there too (the server's own cwd).
        "c.Spawner.notebook_dir = '/home'",
        "c.Spawner.default_url = '/lab/tree/submission'",
        "c.Spawner.environment = {'SHELL': '/bin/bash'}  # JupyterLab terminals: bash, not sh",
        "c.Spawner.start_timeout = 120",
        f"c.Spawner.poll_interval = {config.poll_interval_s}",
        "c.Spawner.http_timeout = 90",
        "",
    ]
    return "\n".join(lines)


def write_config(config: HubConfig) -> Path:
    """Write the config and make sure its secrets exist; returns the config path."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    _secret(config.service_token_file)
    _secret(config.proxy_token_file)
    config.config_file.write_text(render(config))
    return config.config_file


# Where the hub started last with this data directory was reached: what `record_started` keeps.
STARTED_FILE = "started.json"
STARTED_FIELDS = ("portal_url", "public_url", "ip", "port", "hub_port", "proxy_api_port")


def record_started(config: HubConfig) -> None:
    """Note the addresses of the hub being started here, so that every other process of this
    Baseline home (the CLI in another shell above all) reaches the same hub without being given
    the same settings (`baseline.hub_settings.hub_config` reads them back)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    fields = {name: getattr(config, name) for name in STARTED_FIELDS}
    config.started_file.write_text(json.dumps(fields, indent=1) + "\n")


def read_started(data_dir: Path) -> dict[str, str]:
    """What `record_started` noted last in `data_dir` (as strings), or nothing when no hub was
    started there or the note is unreadable."""
    try:
        noted = json.loads((data_dir / STARTED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(noted, dict):
        return {}
    return {k: str(v) for k, v in noted.items() if k in STARTED_FIELDS and v is not None}


def hub_command(config: HubConfig) -> list[str]:
    """The command that runs the hub with the generated config (this interpreter's jupyterhub)."""
    if shutil.which(config.proxy_cmd) is None and not Path(config.proxy_cmd).is_file():
        raise HubConfigError(
            f"configurable-http-proxy not found ({config.proxy_cmd!r}): "
            "run scripts/services/35-hub.sh or `npm install -g configurable-http-proxy`"
        )
    return [sys.executable, "-m", "jupyterhub", "-f", str(write_config(config))]


def start_hub(config: HubConfig, log_file: Path | None = None) -> subprocess.Popen[bytes]:
    """Start the hub as a child process in its data directory (so its relative files stay there).

    The hub imports this package's spawner and authenticator: PYTHONPATH carries the directory
    Baseline is imported from, so a source checkout works without an install.
    """
    command = hub_command(config)
    record_started(config)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    out = open(log_file, "ab") if log_file is not None else None  # noqa: SIM115
    try:
        return subprocess.Popen(
            command,
            cwd=config.data_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,
        )
    finally:
        if out is not None:
            out.close()
