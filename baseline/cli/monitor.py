"""`baseline study watch STUDY`: the study monitor (`baseline.monitor.board`) in a terminal,
redrawn every few seconds until Ctrl-C; `--once` prints one frame (scripts, tests), `--json` the
board as the API gives it."""

from __future__ import annotations

import time

import click

from baseline.context import Context
from baseline.monitor import board, hub_activity
from baseline.studies import studies

CLEAR = "\x1b[H\x1b[2J"


def register(cli: click.Group) -> None:
    group = cli.commands.get("study")
    if not isinstance(group, click.Group):
        raise RuntimeError("baseline.cli.core must register the `study` group first")
    group.add_command(watch)


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def render(found: board.Board, kind: str | None, clock: str | None) -> str:
    """One frame: summary, open alerts, attempts (filtered), hosts."""
    attempts = [
        a
        for a in found.attempts
        if (kind is None or a.kind == kind) and (clock is None or a.clock == clock)
    ]
    q, s = found.queue, found.spend
    open_alerts = [a for a in found.alerts if a.cleared_at is None]
    budget = "no budget" if s.budget_usd is None else f"{(s.share or 0):.0%} of ${s.budget_usd:.2f}"
    lines = [
        f"Study {found.study} (#{found.study_id}) at {found.at:%Y-%m-%d %H:%M:%S} UTC",
        f"attempts {len(found.attempts)}: "
        f"{sum(a.clock == 'running' for a in found.attempts)} running, "
        f"{sum(a.clock == 'paused' for a in found.attempts)} paused; "
        f"queue {q.reproductions_queued} reproductions + {q.gradings_queued} gradings "
        f"(oldest {_hms(q.oldest_age_s)}); spend ${s.total_usd:.2f} ({budget}); "
        f"{len(open_alerts)} open alerts",
        "",
    ]
    if open_alerts:
        lines += ["Open alerts:"]
        lines += [
            f"  #{a.id} {a.rule} {a.subject}: {a.message}"
            + (f" (acknowledged by {a.acknowledged_by})" if a.acknowledged_by else "")
            for a in open_alerts
        ]
        lines.append("")
    rows = [
        [
            str(a.id),
            f"{a.participant} ({a.kind})",
            a.task,
            a.clock + (f" ({a.pause_reason})" if a.pause_reason else ""),
            f"{_hms(a.working_s)}/{_hms(a.limit_s)}",
            _hms(a.idle_working_s) + ("*" if a.hub_activity_unknown else ""),
            f"{a.last_snapshot.kind} {_hms(a.last_snapshot.working_s)}" if a.last_snapshot else "-",
            "-"
            if a.last_grade is None
            else (
                f"{a.last_grade.score:.3f}"
                if a.last_grade.score is not None
                else a.last_grade.status
            ),
            str(len(a.pauses)),
            f"${a.cost_usd:.2f}",
            f"{a.workspace_status} on {a.host}" if a.workspace else "-",
        ]
        for a in attempts
    ]
    lines += _table(
        [
            "id",
            "participant",
            "task",
            "clock",
            "working",
            "idle",
            "snapshot",
            "grade",
            "pauses",
            "cost",
            "workspace",
        ],
        rows,
    )
    unknown = next((a.hub_activity_unknown for a in attempts if a.hub_activity_unknown), None)
    if unknown is not None:
        lines.append(f"* idle from Baseline's records only: {unknown}")
    lines.append("")
    lines += _table(
        ["host", "health", "free GPUs", "workspaces", "error"],
        [
            [
                h.name,
                "disabled" if not h.enabled else "healthy" if h.healthy else "DOWN",
                f"{h.gpus_free}/{h.gpus_total}",
                str(h.running_workspaces),
                h.last_error or "",
            ]
            for h in found.hosts
        ],
    )
    return "\n".join(lines)


@click.command("watch")
@click.argument("study_ref")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the board as JSON (implies --once).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="Seconds between frames.",
)
@click.option(
    "--kind", type=click.Choice(["human", "agent"]), help="Only this kind of participant."
)
@click.option(
    "--clock",
    type=click.Choice(["running", "paused", "not started", "ended"]),
    help="Only attempts whose clock is in this state.",
)
def watch(
    study_ref: str, once: bool, as_json: bool, interval: float, kind: str | None, clock: str | None
) -> None:
    """Watch a study (name or id): every attempt, host, the scoring queue, spend and alerts."""
    ctx = Context.from_settings()
    while True:
        with ctx.session() as session:
            found = board.study_board(
                session,
                studies.find_study(session, study_ref),
                hub=hub_activity.load(ctx.settings),
            )
        if as_json:
            click.echo(board.board_json(found))
            return
        frame = render(found, kind, clock)
        if once:
            click.echo(frame)
            return
        click.echo(CLEAR + frame)
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return
