"""Scoring commands: reproduce a snapshot, score an attempt, re-score a study, run the queue,
show progress, and export a grading as a PaperBench graded tree."""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import ValidationError

from baseline.attempts.snapshots import store_for
from baseline.cli.judge import judge_options
from baseline.cli.paths import OutputFile
from baseline.context import Context
from baseline.errors import NotFound
from baseline.grading import expbench_grading, reproductions
from baseline.grading.expert_grading import export_tree
from baseline.jobs import orchestration
from baseline.models import Attempt, Snapshot, TaskKind
from baseline.studies import studies
from scoring.exp_bench_judge import AllPassedPolicy
from scoring.llm import JudgeConfig


def register(cli: click.Group) -> None:
    for command in (reproduce, score, rescore, grading):
        cli.add_command(command)


def _context() -> Context:
    return Context.from_settings()


@click.command()
@click.argument("snapshot_id", type=int)
@click.option("--salvage", is_flag=True, help="Retry a quick failure with other Python settings.")
def reproduce(snapshot_id: int, salvage: bool) -> None:
    """Reproduce a snapshot now in a fresh workspace (bash reproduce.sh, time-limited)."""
    ctx = _context()
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        if snapshot is None:
            raise NotFound(f"no snapshot {snapshot_id}")
        reproduction_id = reproductions.queue_reproduction(session, snapshot, salvage=salvage).id
    row = reproductions.run_reproduction(ctx, reproduction_id)
    if row.status.value == "queued" and row.retry_at is not None:
        raise click.ClickException(
            f"reproduction {row.id} could not run: {row.error}; the worker "
            "(`baseline serve` or `baseline score`) tries it again"
        )
    if row.status.value == "queued":
        raise click.ClickException(
            f"reproduction {row.id} is waiting: {row.details.get('waiting')}"
        )
    if row.error:
        raise click.ClickException(f"reproduction {row.id} failed: {row.error}")
    click.echo(
        f"reproduction {row.id}: exit code {row.exit_code}, {row.duration_s or 0:.1f} s"
        + (", timed out" if row.timed_out else "")
        + (f", failure: {row.failure_class}" if row.failure_class else ", reproduce.sh succeeded")
        + (", salvage used" if row.salvage_used else "")
    )


@click.command()
@click.argument("attempt_id", type=int)
def score(attempt_id: int) -> None:
    """Reproduce and judge (or script-score) every snapshot of an attempt that needs it."""
    ctx = _context()
    report = orchestration.process_queue(ctx, attempt_id=attempt_id)
    click.echo(report.summary())
    for error in report.errors:
        click.echo(f"  {error}", err=True)
    _print_progress(ctx, attempt_id)
    _refuse_busy(report)


def _refuse_busy(report: orchestration.QueueReport) -> None:
    """Exit 1 naming the jobs another runner (the portal's worker, another command) holds: they
    were not run here, and their results are not known yet."""
    if report.busy:
        raise click.ClickException("; ".join(report.busy))


def _grading_line(grading: orchestration.GradingProgress) -> str:
    """As the portal's progress page says it: leaves for a judge or expert (a script grades
    none), the score, whether it is the task's floor and why, and the error of one that failed."""
    line = f"{grading.kind} {grading.status}"
    if grading.leaves_total:
        line += f" {grading.leaves_graded}/{grading.leaves_total} leaves"
    if grading.score is not None:
        line += f" score {grading.score:.3f}"
        if grading.floor_reason:
            line += f" (at the floor: {grading.floor_reason})"
    if grading.error:
        line += f" ({grading.error.splitlines()[0]})"
    return line


def _print_progress(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        for row in orchestration.progress(session, attempt_id):
            repro = row.reproduction
            state = "not reproduced" if repro is None else f"reproduction {repro.status.value}"
            if row.failure_label:
                state += f" ({row.failure_label})"
            parts = [_grading_line(g) for g in row.gradings]
            click.echo(
                f"snapshot {row.snapshot.id}: {state}; " + ("; ".join(parts) or "no grading")
            )
        attempt = session.get(Attempt, attempt_id)
        if (
            attempt is not None
            and attempt.task.kind is not TaskKind.SCORED
            and orchestration.study_judge(attempt.study) is None
        ):  # else its snapshots stay "no grading" with nothing saying why
            click.echo(
                f"warning: study {attempt.study_id} has no judge: the snapshots of the paper task "
                f"{attempt.task.slug} are reproduced but never graded (set one: baseline grading "
                f"set-judge {attempt.study_id} ...)",
                err=True,
            )


@click.command()
@click.argument("study")
@judge_options
@click.option(
    "--code-dev", is_flag=True, help="Judge Code Development leaves only, no reproduction."
)
@click.option("--run", "run_now", is_flag=True, help="Run the new gradings now, not in background.")
def rescore(
    study: str,
    config: JudgeConfig,
    code_dev: bool,
    run_now: bool,
) -> None:
    """Judge every snapshot of STUDY (a name or an id) again with a new configuration (earlier
    gradings kept)."""
    ctx = _context()
    with ctx.session() as session:
        study_id = studies.find_study(session, study).id
    created = orchestration.rescore(ctx, study_id, config, code_dev, None)
    click.echo(f"{len(created)} grading(s) queued for study {study_id}")
    if run_now:
        report = orchestration.process_queue(ctx)
        click.echo(report.summary())
        _refuse_busy(report)


@click.group()
def grading() -> None:
    """Gradings: export, progress, the scoring queue, the study's judge."""


@grading.command("set-judge")
@click.argument("study")
@judge_options
@click.option(
    "--code-dev", is_flag=True, help="Judge Code Development leaves only, no reproduction."
)
def set_judge(study: str, config: JudgeConfig, code_dev: bool) -> None:
    """Set the judge STUDY's (a name or an id) new snapshots are graded with, without grading
    earlier ones again (`baseline rescore` does both)."""
    ctx = _context()
    with ctx.session() as session:
        found = studies.find_study(session, study)
        orchestration.set_study_judge(session, found, config, code_dev, None)
        study_id = found.id
    click.echo(f"study {study_id}: judge {config.model} ({config.config_hash()[:8]})")


@grading.command("export")
@click.argument("grading_id", type=int)
@click.option("--out", type=OutputFile(), required=True, help="The JSON file to write.")
def export(grading_id: int, out: Path) -> None:
    """Write a judge or expert grading as a PaperBench graded tree (JSON)."""
    ctx = _context()
    with ctx.session() as session:
        tree = export_tree(session, store_for(ctx), grading_id)
    out.write_text(json.dumps(tree, indent=2) + "\n", encoding="utf-8")
    click.echo(f"grading {grading_id} written to {out}")


@grading.command("progress")
@click.argument("attempt_id", type=int)
def progress(attempt_id: int) -> None:
    """Reproduction and grading state of each snapshot of an attempt."""
    _print_progress(_context(), attempt_id)


@grading.command("run-queue")
def run_queue() -> None:
    """Queue what new snapshots need and run it all once (what the background worker does)."""
    report = orchestration.process_queue(_context())
    click.echo(report.summary())
    for error in report.errors:
        click.echo(f"  {error}", err=True)
    _refuse_busy(report)


@grading.command("expbench-policy")
@click.argument("study")
@click.option(
    "--stages",
    default="design,implementation,execution,conclusion",
    show_default=True,
    help="Comma-separated stages that must pass (a stage a task lacks is not required).",
)
@click.option("--threshold", type=float, default=1.0, show_default=True, help="Pass mark.")
@click.option("--no-monitor", is_flag=True, help="Do not require a clean monitor.")
@click.option(
    "--execution-limit-minutes",
    type=float,
    default=None,
    help="Minutes reproduce_exp_bench.sh may run for the execution stage to pass "
    "(EXP-Bench's, the default: 60).",
)
def expbench_policy(
    study: str,
    stages: str,
    threshold: float,
    no_monitor: bool,
    execution_limit_minutes: float | None,
) -> None:
    """Set what "all stages passed" means for STUDY's (a name or an id) EXP-Bench tasks, and
    optionally the execution limit (snapshots are graded again under them, reusing every stage
    grade)."""
    try:
        policy = AllPassedPolicy(
            stages=tuple(s.strip() for s in stages.split(",") if s.strip()),
            threshold=threshold,
            require_monitor=not no_monitor,
        )
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from exc
    ctx = _context()
    with ctx.session() as session:
        found = studies.find_study(session, study)
        expbench_grading.set_study_policy(session, found, policy, None)
        if execution_limit_minutes is not None:
            expbench_grading.set_study_execution_limit(
                session, found, execution_limit_minutes * 60, None
            )
        limit = expbench_grading.study_execution_limit(found) / 60
        study_id = found.id
    click.echo(
        f"study {study_id}: all stages passed = {policy.describe()}; execution within {limit:g} min"
    )
