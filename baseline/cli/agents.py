"""Agent commands: enrol a built-in agent configuration, run or resume its attempts, export a
transcript."""

from __future__ import annotations

import json

import click

from baseline.context import Context
from baseline.errors import InvalidInput, NotFound
from baseline.models import Attempt
from baseline.runs import agent_runs, agent_worker, blacklist_monitor, driver_lease, transcripts
from baseline.studies import agent_enrolment, studies
from baseline.workspaces import attempt_tokens


def register(cli: click.Group) -> None:
    group = click.Group("agent", help="Built-in AI agents: enrol, run, resume, transcripts.")
    group.add_command(enrol)
    group.add_command(run)
    group.add_command(resume)
    group.add_command(transcript)
    group.add_command(worker)
    group.add_command(token)
    cli.add_command(group)
    attempt_group = cli.commands.get("attempt")
    if not isinstance(attempt_group, click.Group):
        attempt_group = click.Group("attempt", help="Attempts: clock, pauses, limits.")
        cli.add_command(attempt_group)
    attempt_group.add_command(monitor)


def _setting(values: tuple[str, ...]) -> dict[str, object]:
    """KEY=VALUE pairs; a value is read as JSON when it parses (numbers, true/false, null)."""
    settings: dict[str, object] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--set {item!r}: expected KEY=VALUE")
        try:
            settings[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[key.strip()] = raw
    return settings


@click.command()
@click.option("--study", "study_ref", required=True, help="Study name or id.")
@click.option("--name", required=True, help="The configuration's display name.")
@click.option("--scaffold", required=True, help="basic or iterative (or a registered one).")
@click.option("--model", required=True, help="The model's name at the endpoint.")
@click.option(
    "--endpoint",
    "--base-url",  # as the judge's commands spell it
    "endpoint",
    required=True,
    help="OpenAI-compatible base URL (…/v1).",
)
@click.option("--runs", "runs_per_task", default=1, show_default=True, type=int,
              help="Attempts per task (best-of-k).")  # fmt: skip
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A setting: input_usd_per_mtok, output_usd_per_mtok, token_limit, cost_limit_usd, "
    "generation_counts, tool_timeout_s, temperature, ...",
)
@click.option("--group", help="The analysis group to put it in (default: scaffold:model).")
@click.option(
    "--pool", is_flag=True, help="Pool it with the group's other configurations (other settings)."
)
def enrol(
    study_ref: str, name: str, scaffold: str, model: str, endpoint: str,
    runs_per_task: int, settings: tuple[str, ...], group: str | None, pool: bool,
) -> None:  # fmt: skip
    """Enrol an agent configuration with N attempts per task of the study."""
    ctx = Context.from_settings()
    with ctx.session() as session:
        study = studies.find_study(session, study_ref)
        enrolment = agent_enrolment.enrol(
            session, study, name=name, scaffold=scaffold, model=model, endpoint=endpoint,
            settings=_setting(settings), runs_per_task=runs_per_task, actor_id=None,
            group=group, pool=pool,
        )  # fmt: skip
        participant = enrolment.participant
        click.echo(
            f"enrolled participant {participant.id} ({participant.group}, settings "
            f"{agent_enrolment.settings_hash(participant)}); "
            f"attempts {', '.join(map(str, enrolment.attempt_ids))}"
        )


def _report(outcome: agent_runs.RunOutcome) -> None:
    click.echo(f"run {outcome.run_id}: {outcome.status.value} after {outcome.steps} steps"
               + (f" ({outcome.end_reason})" if outcome.end_reason else ""))  # fmt: skip


@click.command()
@click.argument("attempt_id", type=int)
def run(attempt_id: int) -> None:
    """Run (or resume) the agent of a launched agent attempt until it ends."""
    _report(agent_worker.run_agent(Context.from_settings(), attempt_id))


@click.command()
def resume() -> None:
    """Resume every unfinished agent run (after a worker restart), one after the other."""
    ctx = Context.from_settings()
    pending = agent_worker.running_attempts(ctx)
    if not pending:
        click.echo("no unfinished agent runs")
    for attempt_id in pending:
        try:
            _report(agent_worker.run_agent(ctx, attempt_id))
        except driver_lease.DriverBusy as exc:  # driven already (the worker): not twice
            click.echo(str(exc))


@click.command()
@click.option(
    "--concurrency", default=8, show_default=True, type=int, help="Attempts driven at once."
)
@click.option(
    "--poll",
    "poll_s",
    default=10.0,
    show_default=True,
    type=float,
    help="Seconds between looks for new attempts.",
)
@click.option("--once", is_flag=True, help="Drive what is runnable now, wait for it, exit.")
def worker(concurrency: int, poll_s: float, once: bool) -> None:
    """Drive every launched agent attempt (new ones, and unfinished runs after a restart).

    Only one worker per database drives at a time (the worker lock); another one stands by and
    takes over when the holder dies."""
    import time

    from baseline.jobs.worker_process import worker_lock

    ctx = Context.from_settings()
    lock = worker_lock(ctx.engine, ctx.settings.home)
    while not lock.try_acquire():
        if once:
            raise click.ClickException("another agent worker is driving this database")
        time.sleep(poll_s)
    click.echo("agent worker: driving this database's agent attempts")
    pool = agent_worker.Worker(ctx, concurrency=concurrency)
    while True:
        for attempt_id in pool.poll():
            click.echo(f"driving the agent of attempt {attempt_id}")
        if once:
            pool.join()
            break
        time.sleep(poll_s)
    for attempt_id, error in pool.errors.items():
        click.echo(f"attempt {attempt_id}: {error}", err=True)


@click.command()
@click.argument("attempt_id", type=int)
def token(attempt_id: int) -> None:
    """Issue an API agent's token for a launched attempt (printed once; revoked at its end)."""
    ctx = Context.from_settings()
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        click.echo(attempt_tokens.issue(session, attempt, attempt_tokens.AGENT, None))


@click.command()
@click.argument("attempt_id", type=int)
def transcript(attempt_id: int) -> None:
    """Print an agent attempt's transcript as JSON lines (settings first, then every step)."""
    ctx = Context.from_settings()
    with ctx.session() as session:
        click.echo(transcripts.export_jsonl(session, attempt_id), nl=False)


@click.command()
@click.argument("attempt_id", type=int)
@click.option("--disqualify", is_flag=True, help="Disqualify the attempt on a new hit.")
def monitor(attempt_id: int, disqualify: bool) -> None:
    """Check an attempt (human or agent) against its task's blacklist.txt: the egress log, the
    agent transcript and the shell history. New hits are stored for review and printed."""
    ctx = Context.from_settings()
    new = blacklist_monitor.scan(ctx, attempt_id, disqualify=disqualify)
    for hit in new:
        click.echo(f"{hit.source}\t{hit.location}\t{hit.evidence}\t(rule {hit.rule})")
    click.echo(f"{len(new)} new hit(s)")
