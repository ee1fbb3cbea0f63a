"""Core commands: init, serve, db, user, study, demo."""

from __future__ import annotations

import json
import secrets
from typing import Any

import click

from baseline import accounts, migrate, studies
from baseline.cli.portal import client_for, portal_options
from baseline.context import Context
from baseline.demo import DEMO_STUDY, seed_demo
from baseline.models import Role, User


def _context() -> Context:
    return Context.from_settings()


def register(cli: click.Group) -> None:
    cli.add_command(init)
    cli.add_command(serve)
    cli.add_command(db)
    cli.add_command(user)
    cli.add_command(study)
    cli.add_command(demo)


@click.command()
@click.option("--admin-email", default="admin@example.org", show_default=True)
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
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--no-scheduler", is_flag=True, help="Serve the portal only.")
@click.option(
    "--no-hub",
    is_flag=True,
    help="Do not start JupyterHub here (also: BASELINE_HUB_MANAGED=false).",
)
def serve(host: str, port: int, no_scheduler: bool, no_hub: bool) -> None:
    """Serve the portal, run the background scheduler and supervise JupyterHub."""
    from app.server import run_server
    from baseline.hub_settings import hub_managed

    ctx = _context()
    if not migrate.is_up_to_date(ctx.engine):
        raise click.ClickException("the database is not at the latest schema: run `baseline init`")
    with_hub = not no_hub and hub_managed(ctx.settings)
    run_server(ctx, host=host, port=port, with_scheduler=not no_scheduler, with_hub=with_hub)


@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply the Alembic migrations up to REVISION."""
    ctx = _context()
    migrate.upgrade(ctx.settings.database_url, revision)
    click.echo(f"database at {migrate.current_revision(ctx.engine)}")


@click.group()
def user() -> None:
    """Manage accounts."""


@user.command("create")
@click.option("--email", required=True)
@click.option("--name", required=True)
@click.option("--role", required=True, type=click.Choice([r.value for r in Role]))
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
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
@click.option("--description", default="")
@click.option("--hardware-profile", default="cpu", show_default=True)
@click.option(
    "--checkpoints",
    default="2,8,32,48",
    show_default=True,
    help="Working hours at which snapshots are taken, comma-separated.",
)
@click.option("--limit-hours", default=48.0, show_default=True, type=float)
@click.option("--wall-clock-hours", type=float)
@click.option("--interval-minutes", type=float, help="Also snapshot every N working minutes.")
@click.option("--time-scale", default=1.0, show_default=True, type=float)
@click.option("--egress", default="blacklist", type=click.Choice(["none", "open", "blacklist"]))
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
    )
    with _context().session() as session:
        created = studies.create_study(session, spec, actor_id=None)
        click.echo(f"created study {created.id} {created.name!r}")


@study.command("list")
@click.option("--json", "as_json", is_flag=True)
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
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--no-serve", is_flag=True, help="Seed the demo study and exit.")
def demo(port: int, no_serve: bool) -> None:
    """Seed the demo studies (idempotent), print where to log in, and serve the portal."""
    from analysis.seed import seed_synthetic_study
    from baseline.snapshots import store_for

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
    from app.server import run_server

    run_server(ctx, host="127.0.0.1", port=port, with_scheduler=True)
