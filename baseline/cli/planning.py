"""`baseline plan`: how many tasks and runs a study needs to detect a gap, and what it costs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from baseline.cli.analysis import load_study_data
from baseline.cli.paths import OutputFile

if TYPE_CHECKING:
    from analysis.planner import Plan


def register(cli: click.Group) -> None:
    cli.add_command(plan)


def _checkpoint(raw: str) -> dict[str, float]:
    parts = raw.split(":")
    try:
        hours, mean_a, mean_b = (float(p) for p in parts)
    except ValueError as exc:
        raise click.BadParameter(
            f"{raw!r}: expected HOURS:MEAN_A:MEAN_B, e.g. 8:0.30:0.45", param_hint="--checkpoint"
        ) from exc
    return {"hours": hours, "mean_a": mean_a, "mean_b": mean_b}


# option name -> PlanSpec field; only the options given override a pilot's measurements
_FIELDS = {
    "shape": "shape",
    "task_sd": "task_sd",
    "attempt_sd": "attempt_sd",
    "zero_share_a": "zero_share_a",
    "zero_share_b": "zero_share_b",
    "attempts_a": "attempts_a",
    "attempts_b": "attempts_b",
    "tasks_per_human": "tasks_per_human",
    "limit_hours": "limit_hours",
    "power": "power",
    "studies": "studies",
    "max_tasks": "max_tasks",
}
_COSTS = {
    "human_hourly_usd": "human_hourly_usd",
    "gpu_hourly_usd": "gpu_hourly_usd",
    "gpus": "gpus_per_workspace",
    "judge_usd_per_snapshot": "judge_usd_per_snapshot",
    "agent_usd_per_run": "agent_usd_per_attempt",
}


@click.command()
@click.option("--pilot", help="A pilot study (name or id) to measure the guesses on.")
@click.option(
    "--group-a", default="human", show_default=True, help="The first group (a pilot's group name)."
)
@click.option(
    "--group-b", default="agent", show_default=True, help="The group compared with the first."
)
@click.option(
    "--checkpoint",
    "checkpoints",
    multiple=True,
    help="HOURS:MEAN_A:MEAN_B, the two groups' expected means there (repeatable); with --pilot, "
    "only these hours of the pilot.",
)
@click.option(
    "--shape",
    type=click.Choice(["bounded", "positive"]),
    help="Scores in [0, 1] (rubric, EXP-Bench), or any score above 0 (scored tasks).",
)
@click.option("--task-sd", type=float, help="Task-to-task spread (logit scale, or log scale).")
@click.option("--attempt-sd", type=float, help="Attempt-to-attempt spread, same scale.")
@click.option("--zero-share-a", type=float, help="Share of group A's attempts at exactly 0.")
@click.option("--zero-share-b", type=float, help="Share of group B's attempts at exactly 0.")
@click.option("--attempts-a", type=int, help="Attempts per task of group A.")
@click.option("--attempts-b", type=int, help="Runs per task of group B.")
@click.option("--tasks-per-human", type=int, help="Tasks one human participant takes on.")
@click.option("--limit-hours", type=float, help="Working-time limit of an attempt.")
@click.option("--power", type=float, help="Power to reach (default 0.8).")
@click.option("--studies", type=int, help="Simulated studies per point (default 2000).")
@click.option("--max-tasks", type=int, help="The most tasks to consider (default 100).")
@click.option("--human-hourly-usd", type=float, help="Participant pay per working hour.")
@click.option("--gpu-hourly-usd", type=float, help="Cost of one GPU hour.")
@click.option("--gpus", type=int, help="GPUs per workspace (the hardware profile's).")
@click.option("--judge-usd-per-snapshot", type=float, help="Judge cost of grading one snapshot.")
@click.option("--agent-usd-per-run", type=float, help="Model cost of one agent run.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
@click.option(
    "--out",
    type=OutputFile(),
    help="Also draw the power curves to this .html file.",
)
def plan(
    pilot: str | None,
    group_a: str,
    group_b: str,
    checkpoints: tuple[str, ...],
    as_json: bool,
    out: Path | None,
    **options: Any,
) -> None:
    """Simulate studies to find how many tasks detect the gap at each checkpoint, and the cost."""
    from analysis import planner

    given = {_FIELDS[k]: v for k, v in options.items() if k in _FIELDS and v is not None}
    costs = {_COSTS[k]: v for k, v in options.items() if k in _COSTS and v is not None}
    guesses = [_checkpoint(raw) for raw in checkpoints]
    if pilot is None:
        if not guesses:
            raise click.UsageError("give --checkpoint HOURS:MEAN_A:MEAN_B, or --pilot STUDY")
        for needed in ("task_sd", "attempt_sd"):
            if needed not in given:
                flag = "--" + needed.replace("_", "-")
                raise click.UsageError(f"give {flag} (or measure it with --pilot STUDY)")
    try:
        data = load_study_data(pilot) if pilot is not None else None
        spec = planner.build_spec(data, group_a, group_b, guesses, given, costs)
    except planner.PlanError as exc:
        raise click.ClickException(str(exc)) from exc
    result = planner.plan(spec)
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        _print(result)
    if out is not None:
        from analysis import plots

        out.write_text(plots.power_figure(result).to_html(include_plotlyjs=True))
        click.echo(f"wrote {out}", err=True)


def _print(result: Plan) -> None:
    spec = result.spec
    click.echo(
        f"{spec.group_b} vs {spec.group_a}: {spec.shape} scores, task sd {spec.task_sd:.3g}, "
        f"attempt sd {spec.attempt_sd:.3g}, {spec.attempts_a} and {spec.attempts_b} attempts "
        f"per task, power {spec.power:.0%} at {spec.level:.0%} ({spec.studies} simulated studies "
        "per point)"
    )
    for c in result.checkpoints:
        reached = (
            f"{c.tasks_needed} tasks (power {c.power_at_needed:.3f} ± {c.mc_se:.3f})"
            if c.tasks_needed is not None
            else f"not within {spec.max_tasks} tasks (power {c.power_curve[-1][1]:.3f} there)"
        )
        click.echo(f"  {c.hours:g} h, gap {c.gap:+.3g}: {reached}")
    if result.budget is None:
        click.echo("No budget: some checkpoint's gap is out of reach.")
        return
    b = result.budget
    click.echo(
        f"A study of {b.tasks} tasks: {b.human_participants} human participants "
        f"({b.human_attempts} attempts), {b.agent_runs} agent runs; human pay "
        f"${b.human_pay_usd:,.0f}, {b.gpu_hours:,.0f} GPU hours (${b.gpu_usd:,.0f}), judge "
        f"${b.judge_usd:,.0f}, agent models ${b.agent_usd:,.0f}: ${b.total_usd:,.0f} in all"
    )
