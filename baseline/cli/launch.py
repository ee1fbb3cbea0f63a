"""Attempt commands: create an attempt (a participant on a task) and launch it."""

from __future__ import annotations

import click

from baseline.attempts import launch
from baseline.context import Context
from baseline.errors import InvalidInput, NotFound
from baseline.models import Attempt, AttemptStatus, Participant
from baseline.studies import studies
from baseline.tasks import tasks


def register(cli: click.Group) -> None:
    group = cli.commands.get("attempt")
    if not isinstance(group, click.Group):
        group = click.Group("attempt", help="Attempts: clock, pauses, limits.")
        cli.add_command(group)
    group.add_command(create)
    group.add_command(launch_cmd)


@click.command()
@click.option("--study", "study_ref", required=True, help="Study name or id.")
@click.option(
    "--participant",
    "participant_id",
    required=True,
    type=int,
    help="Participant id (a person enrolled, or an agent configuration).",
)
@click.option("--task", "task_ref", required=True, help="Task slug or id.")
@click.option("--launch", "launch_now", is_flag=True, help="Launch it right away.")
def create(study_ref: str, participant_id: int, task_ref: str, launch_now: bool) -> None:
    """Create an attempt: one participant (human or agent) on one task of a study."""
    ctx = Context.from_settings()
    with ctx.session() as session:
        study = studies.find_study(session, study_ref)
        participant = session.get(Participant, participant_id)
        if participant is None or participant.study_id != study.id:
            raise NotFound(f"study {study.name!r} has no participant {participant_id}")
        task = tasks.find_task(session, task_ref)
        attempt = studies.create_attempt(session, participant, task, actor_id=None)
        attempt_id = attempt.id
    click.echo(f"created attempt {attempt_id}")
    if launch_now:
        _launch(ctx, attempt_id, None)


@click.command("launch")
@click.argument("attempt_id", type=int)
@click.option("--image", help="Workspace image (default: the profile's image, built if missing).")
def launch_cmd(attempt_id: int, image: str | None) -> None:
    """Place an attempt's workspace and start its clock (or leave it pending)."""
    _launch(Context.from_settings(), attempt_id, image)


def _launch(ctx: Context, attempt_id: int, image: str | None) -> None:
    """Launch; exits non-zero, with the end reason, when the attempt failed to start (a Task
    Standard family's start() raised), so a script never mistakes it for a launch."""
    try:
        status = launch.launch(ctx, attempt_id, None, image=image)
    except InvalidInput as exc:
        raise click.ClickException(f"attempt {attempt_id} not launched: {exc.message}") from exc
    if status is AttemptStatus.FAILED:
        with ctx.session() as session:
            attempt = session.get(Attempt, attempt_id)
            reason = attempt.end_reason if attempt is not None else None
        raise click.ClickException(
            f"attempt {attempt_id} failed to start: {reason or 'no reason was recorded'}"
        )
    click.echo(f"attempt {attempt_id} is {status.value}")
