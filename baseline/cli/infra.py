"""Infrastructure commands: workspace images, Docker hosts, workspace reconciliation."""

from __future__ import annotations

import click
import docker
from sqlalchemy import select

from baseline.attempts import host_outage
from baseline.context import Context
from baseline.errors import DomainError
from baseline.grading import grading_recovery, reproductions
from baseline.models import Host, Workspace, WorkspaceStatus
from baseline.workspaces import backends, gpu_allocation, workspaces
from infra import family_run
from infra.hardware import ProfileConfigError, get_profile
from infra.image_build import ImageBuildError, build_workspace_image


def register(cli: click.Group) -> None:
    cli.add_command(image)
    cli.add_command(host)
    cli.add_command(workspace)


@click.group()
def image() -> None:
    """Workspace images."""


@image.command("build")
@click.argument("profile")
@click.option(
    "--docker-url",
    default="unix:///var/run/docker.sock",
    show_default=True,
    help="The Docker Engine to build on.",
)
def image_build(profile: str, docker_url: str) -> None:
    """Build (or reuse) the workspace image of hardware PROFILE and print its pinned digest."""
    try:  # a wrong profile name is the user's error whether or not the engine answers
        get_profile(profile)
    except ProfileConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        client = docker.DockerClient(base_url=docker_url, use_ssh_client=False)
    except Exception as exc:  # the SDK raises several unrelated types for an unreachable engine
        raise click.ClickException(
            f"cannot reach the Docker Engine at {docker_url}: {exc}"
        ) from exc
    try:
        built = build_workspace_image(client, profile)
    except (ImageBuildError, ProfileConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        client.close()
    click.echo(f"{built.tag} {built.digest} ({'built' if built.built else 'cached'})")


def _gpus(spec: str | None) -> list[dict[str, object]] | None:
    """`--gpus "NVIDIA A10:2"` declares GPUs where nvidia-smi is absent."""
    if not spec:
        return None
    model, _, count = spec.rpartition(":")
    if not model or not count.isdigit():
        raise click.BadParameter("expected MODEL:COUNT, e.g. 'NVIDIA A10:2'", param_hint="--gpus")
    return [{"model": model, "count": int(count)}]


def _gpu_count(entry: Host) -> int | str:
    try:
        return len(gpu_allocation.inventory(entry))
    except DomainError:
        return "invalid"


@click.group()
def host() -> None:
    """Docker hosts that run workspaces."""


@host.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--gpus", help="Declare GPUs as MODEL:COUNT when the host has no nvidia-smi.")
@click.option("--no-check", is_flag=True, help="Record the host without probing it.")
def host_add(name: str, url: str, gpus: str | None, no_check: bool) -> None:
    """Add host NAME reached at URL (unix:///var/run/docker.sock or ssh://user@host)."""
    with Context.from_settings().session() as session:
        added = workspaces.add_host(session, name, url, None, declared_gpus=_gpus(gpus))
        line = f"added host {added.name} {added.docker_url}"
        if not no_check:
            health = workspaces.check_host(session, added)
            line += (
                " healthy" if added.healthy else f" UNHEALTHY: {health.error or added.last_error}"
            )
    click.echo(line)


@host.command("list")
def host_list() -> None:
    """List hosts with their health, GPUs and live workspaces."""
    with Context.from_settings().session() as session:
        hosts = workspaces.list_hosts(session)
        if not hosts:
            click.echo("no hosts; add one with `baseline host add NAME URL`")
            return
        for entry in hosts:
            live = len(workspaces.live_workspaces(session, entry))
            state = "healthy" if entry.healthy else "unhealthy"
            if not entry.enabled:
                state = "disabled"
            checked = (
                entry.last_checked_at.isoformat(timespec="seconds")
                if entry.last_checked_at
                else "never"
            )
            click.echo(
                f"{entry.name}\t{entry.docker_url}\t{state}\tgpus={_gpu_count(entry)}\t"
                f"workspaces={live}\tchecked={checked}"
            )


@host.command("check")
@click.argument("name", required=False)
def host_check(name: str | None) -> None:
    """Probe one host (or all) and record the result; exits 1 when any is unhealthy."""
    with Context.from_settings().session() as session:
        targets = [workspaces.get_host(session, name)] if name else workspaces.list_hosts(session)
        click.echo(
            f"deployment: {backends.deployment()} (label {backends.DEPLOYMENT_LABEL}; "
            "reconcile removes only this deployment's containers)"
        )
        if not targets:
            raise click.ClickException("no hosts to check")
        bad = 0
        for entry in targets:
            health = workspaces.check_host(session, entry)
            for note in health.details.get("networks", []):
                click.echo(f"{entry.name}: {note}")
            if entry.healthy:
                click.echo(
                    f"{entry.name}: healthy (docker {health.docker_version}, "
                    f"{health.cpus} CPUs, {_gpu_count(entry)} GPUs, {health.latency_ms} ms)"
                )
            else:
                bad += 1
                click.echo(f"{entry.name}: UNHEALTHY: {entry.last_error}")
    if bad:
        raise click.ClickException(f"{bad} host(s) unhealthy")


@click.group()
def workspace() -> None:
    """Workspaces."""


@workspace.command("reconcile")
@click.option("--no-restart", is_flag=True, help="Mark dead workspaces but do not restart them.")
def workspace_reconcile(no_restart: bool) -> None:
    """Recover reproductions, gradings and intermediate scores whose process stopped; destroy
    disposable workspaces no job holds; remove containers no live workspace owns; restart dead
    ones; place pending ones. What the scheduler does every minute, at once."""
    ctx = Context.from_settings()
    # First the reproductions whose process stopped: their workspaces are then no longer live.
    for reproduction_id in reproductions.recover_interrupted(ctx):
        click.echo(
            f"reproduction {reproduction_id}: its process stopped; workspace removed, queued"
        )
    for grading_id in grading_recovery.recover_interrupted(ctx):
        click.echo(f"grading {grading_id}: its process stopped; queued again")
    for score_log_id in grading_recovery.recover_intermediate_scores(ctx):
        click.echo(f"intermediate score {score_log_id}: its process stopped; closed, no score")
    for name in grading_recovery.sweep(ctx):
        if family_run.is_scoring_run(name):
            click.echo(f"removed {name} (a family's scoring run no job holds)")
        else:
            click.echo(f"destroyed {name} (a disposable workspace no job holds)")
    report = workspaces.reconcile_job(ctx, restart_dead=not no_restart)
    for host_name, names in report.removed.items():
        for removed in names:
            click.echo(f"removed {removed} from {host_name} (no live workspace)")
    for name in report.died:
        click.echo(f"died {name}")
    for name in report.restarted:
        click.echo(f"restarted {name}")
    for name in report.placed:
        click.echo(f"placed {name}")
    with ctx.session() as session:  # what still waits, and why (a host refused it, or no room)
        for name, error in session.execute(
            select(Workspace.name, Workspace.last_error)
            .where(Workspace.status == WorkspaceStatus.PENDING)
            .order_by(Workspace.id)
        ):
            click.echo(f"pending {name}: {error or 'no enabled, healthy host has room for it'}")
    for where, problem in report.errors.items():
        click.echo(f"error {where}: {problem}", err=True)
    click.echo(
        f"reconciled: {sum(len(v) for v in report.removed.values())} removed, "
        f"{len(report.died)} died, {len(report.restarted)} restarted, {len(report.placed)} placed"
    )
    if report.errors:
        raise click.ClickException(f"{len(report.errors)} problem(s) during reconcile")


@host.command("probe")
def host_probe() -> None:
    """One outage probe round (what the scheduler runs every 30 s): pause or resume attempts."""
    ctx = Context.from_settings()
    with ctx.session() as session:
        report = host_outage.probe_hosts(ctx, session)
    for name, error in report.down.items():
        click.echo(f"{name}: DOWN: {error}")
    for attempt_id in report.paused:
        click.echo(f"attempt {attempt_id}: paused (outage)")
    for attempt_id in report.resumed:
        click.echo(f"attempt {attempt_id}: outage ended")
    for attempt_id, target in report.moved.items():
        click.echo(f"attempt {attempt_id}: moved to {target}")
    for attempt_id, error in report.errors.items():
        click.echo(f"attempt {attempt_id}: not moved: {error}")


@host.command("move-attempt")
@click.argument("attempt_id", type=int)
@click.option("--to", "to_host", help="Target host (default: any healthy host with room).")
def host_move_attempt(attempt_id: int, to_host: str | None) -> None:
    """Move an attempt off its host, restoring its latest snapshot into a new workspace."""
    workspace, target = host_outage.move(Context.from_settings(), attempt_id, to_host, None)
    click.echo(f"attempt {attempt_id}: now in {workspace.name} on {target}")


@host.command("outage-move")
@click.argument("study")
@click.argument("policy", type=click.Choice(host_outage.MOVE_POLICIES))
def host_outage_move(study: str, policy: str) -> None:
    """Whether STUDY's attempts leave a lost host by themselves (automatic) or by hand."""
    host_outage.set_move_policy(Context.from_settings(), study, policy, None)
    click.echo(f"{study}: outage move {policy}")
