"""Core commands: init, serve, db, user, study, demo."""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
import warnings
from typing import Any, NoReturn

import click

from baseline import migrate
from baseline.cli.portal import client_for, portal_options
from baseline.config import Settings
from baseline.context import Context
from baseline.demo.demo import DEMO_STUDY, seed_demo
from baseline.models import Role, User
from baseline.people import accounts
from baseline.studies import studies


def _context() -> Context:
    return Context.from_settings()


def register(cli: click.Group) -> None:
    cli.add_command(init)
    cli.add_command(serve)
    cli.add_command(db)
    cli.add_command(user)
    cli.add_command(study)
    cli.add_command(demo)


# The portal's port, for `serve` and `demo` alike.
PORT_OPTION = click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port to serve on.",
)


@click.command()
@click.option(
    "--admin-email",
    default="admin@example.org",
    show_default=True,
    help="The first admin account's e-mail (made once, when no admin exists).",
)
@click.option("--admin-password", help="Generated and printed when omitted.")
def init(admin_email: str, admin_password: str | None) -> None:
    """Create or upgrade the database and the first admin account."""
    ctx = _context()
    migrate.upgrade(ctx.settings.database_url)
    with ctx.session() as session:
        if session.query(User).filter(User.role == Role.ADMIN).first() is not None:
            click.echo(f"database ready at {ctx.settings.database_url}; an admin exists already")
            return
        password = admin_password or secrets.token_urlsafe(12)
        accounts.create_user(session, admin_email, "Administrator", password, Role.ADMIN)
    click.echo(f"database ready at {ctx.settings.database_url}")
    click.echo(f"admin: {admin_email}  password: {password}")


@click.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: all)."
)
@PORT_OPTION
@click.option("--no-scheduler", is_flag=True, help="Serve the portal only.")
@click.option(
    "--no-hub",
    is_flag=True,
    help="Do not start JupyterHub here (also: BASELINE_HUB_MANAGED=false).",
)
@click.option(
    "--no-worker",
    is_flag=True,
    help="Do not start the agent worker here (also: BASELINE_WORKER_MANAGED=false).",
)
def serve(host: str, port: int, no_scheduler: bool, no_hub: bool, no_worker: bool) -> None:
    """Serve the portal, run the background scheduler, supervise JupyterHub and the agent
    worker."""
    from app.server import run_server
    from baseline.hub_settings import hub_managed
    from baseline.jobs.worker_process import worker_managed

    ctx = _context()
    if not migrate.is_up_to_date(ctx.engine):
        raise click.ClickException("the database is not at the latest schema: run `baseline init`")
    with_hub = not no_hub and hub_managed(ctx.settings)
    with_worker = not no_worker and worker_managed(ctx.settings)
    quiet_library_noise()
    run_server(
        ctx, host=host, port=port, with_scheduler=not no_scheduler, with_hub=with_hub,
        with_worker=with_worker,
    )  # fmt: skip


@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.option(
    "--revision", default="head", show_default=True, help="An Alembic revision id, or head."
)
def db_upgrade(revision: str) -> None:
    """Apply the Alembic migrations up to REVISION."""
    ctx = _context()
    migrate.upgrade(ctx.settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(ctx.engine)}")


@click.group()
def user() -> None:
    """Manage accounts."""


@user.command("create")
@click.option("--email", required=True, help="Also the login name.")
@click.option("--name", required=True, help="The name the portal shows.")
@click.option(
    "--role", required=True, type=click.Choice([r.value for r in Role]), help="What they may do."
)
@click.option(
    "--password",
    prompt=True,
    hide_input=True,
    confirmation_prompt=True,
    help="Asked for when omitted.",
)
def user_create(email: str, name: str, role: str, password: str) -> None:
    """Create an account with a role."""
    with _context().session() as session:
        created = accounts.create_user(session, email, name, password, Role(role))
        click.echo(f"created user {created.id} {created.email} ({created.role.value})")


@click.group()
def study() -> None:
    """Create and list studies."""


@study.command("create")
@click.argument("name")
@click.option("--description", default="", help="What the study is for (shown on its page).")
@click.option(
    "--hardware-profile",
    default="cpu",
    show_default=True,
    help="Every workspace gets exactly this profile (cpu, a10, h100 or one configured).",
)
@click.option(
    "--checkpoints",
    default="2,8,32,48",
    show_default=True,
    help="Working hours at which snapshots are taken, comma-separated.",
)
@click.option(
    "--limit-hours",
    default=48.0,
    show_default=True,
    type=float,
    help="Working-time limit of an attempt (pauses do not count).",
)
@click.option(
    "--wall-clock-hours",
    type=float,
    help="Cap on an attempt's time from its start, pauses included (default: none).",
)
@click.option("--interval-minutes", type=float, help="Also snapshot every N working minutes.")
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Working seconds per wall second: 1 for real studies, e.g. 3600 for a dry run.",
)
@click.option(
    "--egress",
    default="blacklist",
    show_default=True,
    type=click.Choice(["none", "open", "blacklist"]),
    help="Workspaces' network: none, open, or open except the task's blacklist.",
)
@click.option(
    "--idle-pause-minutes",
    type=float,
    help="Pause a participant's clock (reason idle) after N working minutes without activity "
    "in their workspace (default: off).",
)
@click.option(
    "--snapshot-policy",
    default="baseline",
    show_default=True,
    type=click.Choice(list(studies.SNAPSHOT_POLICIES)),
    help="What a snapshot keeps: baseline leaves caches, virtual environments, node_modules, "
    "wandb and __pycache__ out; paperbench keeps them, as PaperBench's tarball does.",
)
def study_create(
    name: str,
    description: str,
    hardware_profile: str,
    checkpoints: str,
    limit_hours: float,
    wall_clock_hours: float | None,
    interval_minutes: float | None,
    time_scale: float,
    egress: str,
    idle_pause_minutes: float | None,
    snapshot_policy: str,
) -> None:
    """Create a study named NAME."""
    try:
        hours = [float(h) for h in checkpoints.split(",") if h.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"not a list of numbers: {checkpoints!r}") from exc
    spec = studies.StudySpec(
        name=name,
        description=description,
        hardware_profile=hardware_profile,
        checkpoint_hours=hours,
        working_time_limit_hours=limit_hours,
        wall_clock_limit_hours=wall_clock_hours,
        snapshot_interval_minutes=interval_minutes,
        time_scale=time_scale,
        egress_policy=egress,
        idle_pause_minutes=idle_pause_minutes,
        snapshot_policy=snapshot_policy,
    )
    with _context().session() as session:
        created = studies.create_study(session, spec, actor_id=None)
        click.echo(f"created study {created.id} {created.name!r}")


@study.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@portal_options
def study_list(as_json: bool, url: str | None, token: str | None) -> None:
    """List studies (with --url: those the token's user may see on that portal)."""
    keys = ("id", "name", "status", "hardware_profile", "checkpoint_hours")
    remote = client_for(url, token)
    rows: list[dict[str, Any]]
    if remote is not None:
        rows = [{k: s[k] for k in keys} for s in remote.get("/studies")["studies"]]
    else:
        with _context().session() as session:
            rows = [
                {
                    "id": s.id,
                    "name": s.name,
                    "status": s.status.value,
                    "hardware_profile": s.hardware_profile,
                    "checkpoint_hours": s.checkpoint_hours,
                }
                for s in studies.list_studies(session)
            ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no studies")
    for row in rows:
        hours = ",".join(f"{h:g}" for h in row["checkpoint_hours"])
        click.echo(f"{row['id']:>4}  {row['name']}  [{row['status']}]  checkpoints {hours}h")


@click.command()
@PORT_OPTION
@click.option("--no-serve", is_flag=True, help="Seed the demo study and exit.")
@click.option(
    "--no-live", is_flag=True, help="Serve without the live study (agents on the replay model)."
)
@click.option(
    "--replay-port",
    type=click.IntRange(1, 65535),
    help="Port of the bundled replay model (default: the portal's port + 1, else a free one).",
)
@click.option(
    "--workspaces",
    type=click.Choice(["auto", "docker", "sandbox"]),
    default="auto",
    show_default=True,
    envvar="BASELINE_DEMO_WORKSPACES",
    help="Where the live study's workspaces run (auto: Docker when an engine answers at "
    "/var/run/docker.sock; also BASELINE_DEMO_WORKSPACES).",
)
def demo(
    port: int, no_serve: bool, no_live: bool, replay_port: int | None, workspaces: str
) -> None:
    """Seed the demo studies (idempotent), print where to log in, and serve the portal.

    Serving also starts the live demo study: built-in agents work on the demo tasks, driven by
    Baseline's replay model (recorded answers, no API key), time-scaled, while you watch."""
    from analysis.seed import seed_synthetic_study
    from app.server import check_port
    from baseline.attempts.snapshots import store_for

    if not no_serve:
        check_port("127.0.0.1", port)
    ctx = _context()
    migrate.upgrade(ctx.settings.database_url)
    with ctx.session() as session:
        info = seed_demo(session, ctx.settings)
        synthetic = seed_synthetic_study(session, store=store_for(ctx))
        synthetic_name = synthetic.name
    click.echo(f"Baseline demo at http://127.0.0.1:{port}/")
    click.echo(
        f"  studies: {DEMO_STUDY!r} (bundled demo tasks) and {synthetic_name!r} (SYNTHETIC data)"
    )
    for role, (email, password) in info.credentials.items():
        click.echo(f"  {role:<12} {email}  password: {password}")
    if no_serve:
        return
    # The hub sends its logins back to this portal (unless configured otherwise).
    os.environ.setdefault("BASELINE_HUB_PORTAL_URL", f"http://127.0.0.1:{port}")
    hub_ports_follow(ctx.settings, port)
    quiet_library_noise()
    # Ctrl-C ends the demo (its clean-up runs), even when a shell started it as a background
    # job: a non-interactive shell's `&` makes the job ignore SIGINT, and Python then installs
    # no handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _own_engine_objects(ctx)
    live = None if no_live else _start_live_demo(ctx, replay_port, port, workspaces)
    from app.server import run_server
    from baseline.demo.live_demo import SANDBOX, demo_notice

    backend, with_hub = live or (None, False)
    # The scheduler reconciles hosts through Docker: not on a machine with only the sandbox (the
    # live demo's loop takes its agents' checkpoints and runs their scoring itself).
    try:
        run_server(
            ctx,
            host="127.0.0.1",
            port=port,
            with_scheduler=backend != SANDBOX,
            with_hub=with_hub,
            notice=(
                None
                if backend is None
                else demo_notice(backend, jupyterlab=with_hub, chosen=workspaces != "auto")
            ),
        )
        code = 0
    except KeyboardInterrupt:
        code = 130
    except SystemExit as stop:  # SIGTERM (see `run_server`)
        code = stop.code if isinstance(stop.code, int) else 0
    _leave_now(code)


NOISY_LOGGERS = ("kaleido", "choreographer")  # INFO lines at every figure export


def quiet_library_noise() -> None:
    """Keep the terminal for Baseline's own lines: the figure exporter's driver logs INFO at
    every export, and apispec warns that a schema used both as a response and nested "has
    already been added to the spec" each time the spec is built (its references resolve: the
    API's schemathesis test reads the spec)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore",
        message=r".* has already been added to the spec",
        category=UserWarning,
        module=r"apispec\.",
    )


def hub_ports_follow(settings: Settings, port: int) -> None:
    """JupyterHub's ports follow the portal's (``PORT=9000 make demo``: 9010, 9011, 9012, as
    8000 gives the defaults 8010-8012), unless set in the environment or the configuration."""
    if port + 12 > 65535:
        return
    for name, offset in (("hub_port", 10), ("hub_api_port", 11), ("hub_proxy_api_port", 12)):
        env = f"BASELINE_{name.upper()}"
        if env not in os.environ and settings.extra.get(name) is None:
            os.environ[env] = str(port + offset)


def _leave_now(code: int) -> NoReturn:
    """End the demo at once once its server stopped: run the exit handlers (they stop the egress
    proxies, flush the logs), then leave without waiting for the work in flight. Python would
    otherwise join every worker thread first: an agent's step, a reproduction, a grading, which
    under load kept a Ctrl-C'd demo alive for minutes. What they leave is the demo's own: its
    workspaces go with the reaper (`baseline.demo.engine_cleanup`), a reproduction left running
    is recovered by the next start (`baseline.grading.reproductions.recover_interrupted`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def _own_engine_objects(ctx: Context) -> None:
    """The demo's workspaces are a deployment of its own, removed from the Docker Engine when it
    ends, whatever ends it (`baseline.demo.engine_cleanup`): before anything of it starts."""
    from baseline.attempts.launch import LOCAL_ENGINE
    from baseline.demo import engine_cleanup
    from baseline.demo.live_demo import docker_available

    deployment = engine_cleanup.use_own_deployment(ctx.settings.home)
    if docker_available():
        engine_cleanup.start_reaper(LOCAL_ENGINE, deployment)
        click.echo(
            f"  Docker: the demo's workspaces are deployment {deployment!r}, removed from the "
            "engine when the demo ends"
        )


def _hub_for_demo(ctx: Context) -> bool:
    """JupyterHub runs next to a Docker demo (as `baseline serve` does) when its proxy is
    installed; without it the demo says so and runs the rest."""
    from baseline.config import ConfigError
    from baseline.hub_settings import hub_config, hub_managed

    try:
        if not hub_managed(ctx.settings):
            return False
        proxy = hub_config(ctx.settings).proxy_cmd
    except ConfigError as exc:
        click.echo(f"  JupyterLab: not started: {exc}")
        return False
    if shutil.which(proxy) is None:
        click.echo(
            f"  JupyterLab: not started: {proxy} is not installed "
            "(npm install -g configurable-http-proxy)"
        )
        return False
    return True


def _start_live_demo(
    ctx: Context, replay_port: int | None, portal_port: int, workspaces: str
) -> tuple[str, bool] | None:
    """The replay model and the live study's loop, in threads of this process (see
    `baseline.demo.live_demo`); its set-up (the workspace image, the launches) runs in the loop's
    thread, so the portal answers at once."""
    from baseline.attempts.launch import LOCAL_ENGINE
    from baseline.demo import live_demo
    from baseline.demo.replay_model import ReplayModel

    backend = workspaces
    if workspaces == "auto":
        backend = live_demo.DOCKER if live_demo.docker_available() else live_demo.SANDBOX
    if backend == live_demo.SANDBOX and shutil.which("bwrap") is None:
        click.echo(
            f"  live study: not started: no Docker Engine answers at {LOCAL_ENGINE} and "
            "bubblewrap (bwrap) is not installed for the local sandbox backend"
        )
        return None
    replay = ReplayModel(port=replay_port or (portal_port % 65535) + 1)
    try:
        replay.start()
    except OSError as exc:
        if replay_port is not None:  # asked for: say why it cannot be had
            raise click.ClickException(f"replay model on port {replay_port}: {exc}") from exc
        replay = ReplayModel(port=0)  # the portal's port + 1 is taken: any free port will do
        replay.start()
    try:
        with_hub = backend == live_demo.DOCKER and _hub_for_demo(ctx)
        runner = live_demo.LiveDemo(
            ctx,
            replay.base_url,
            backend=backend,
            backend_chosen=workspaces != "auto",
            with_participant=with_hub,
            on_progress=click.echo,
        )
    except OSError as exc:  # the sandbox's cgroups cannot be made (not root, no cgroup v1)
        replay.stop()
        click.echo(f"  live study: not started: the local sandbox backend cannot run: {exc}")
        return None
    # One line per model call (the agents' and the judge's) would drown the portal's log.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet_library_noise()

    def run() -> None:
        try:
            runner.setup()
        except Exception as exc:  # the portal stays up; say why the live study did not start
            click.echo(f"  live study: set-up failed: {exc}", err=True)
            return
        runner.run_forever()

    threading.Thread(target=run, name="live-demo", daemon=True).start()
    click.echo(
        f"  live: {live_demo.LIVE_STUDY!r}: built-in agents work on both demo tasks, driven by "
        "the replay model (recorded, no API key); checkpoints are reproduced and graded as they "
        f"fall due. {live_demo.scale_words()} "
        f"{live_demo.backend_words(backend, workspaces != 'auto')}"
    )
    return backend, with_hub
