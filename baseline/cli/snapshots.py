"""Snapshot and attempt commands: verify, list, export, diff, take; pause, resume, extend, time,
submit, disqualify, withdraw."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from baseline.attempts import attempts, clock, snapshots
from baseline.cli.portal import client_for, portal_options
from baseline.context import Context
from baseline.errors import NotFound
from baseline.models import Attempt, PauseReason, utcnow
from baseline.studies import studies


def _context() -> Context:
    return Context.from_settings()


def register(cli: click.Group) -> None:
    cli.add_command(snapshot)
    group = cli.commands.get("attempt")
    if not isinstance(group, click.Group):
        group = click.Group("attempt", help="Attempts: clock, pauses, limits.")
        cli.add_command(group)
    for command in (pause, resume, extend, clock_cmd, time_used, submit, disqualify, withdraw):
        group.add_command(command)


@click.group()
def snapshot() -> None:
    """Snapshots of attempts' submissions."""


@snapshot.command("verify")
@click.option("--attempt", "attempt_id", type=int, help="Only this attempt's snapshots.")
def verify(attempt_id: int | None) -> None:
    """Re-hash every blob of every snapshot; exit 1 when anything is missing or corrupt."""
    ctx = _context()
    with ctx.session() as session:
        results = snapshots.verify_snapshots(session, snapshots.store_for(ctx), attempt_id)
    bad = [r for r in results if not r.ok]
    for result in bad:
        for problem in result.problems:
            click.echo(
                f"snapshot {result.snapshot_id} (attempt {result.attempt_id}): "
                f"{problem.path}: {problem.detail}"
            )
    click.echo(f"{len(results) - len(bad)} of {len(results)} snapshots intact")
    if bad:
        sys.exit(1)


@snapshot.command("list")
@click.argument("attempt_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
def list_cmd(attempt_id: int, as_json: bool) -> None:
    """List an attempt's snapshots with their working times and sizes."""
    with _context().session() as session:
        if session.get(Attempt, attempt_id) is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        rows = [
            {
                "id": s.id,
                "kind": s.kind.value,
                "due_working_s": s.due_working_s,
                "taken_working_s": s.taken_working_s,
                "late": s.late,
                "files": s.file_count,
                "bytes": s.total_bytes,
                "skipped": s.skipped_count,
                "source": s.source,
                "manifest": s.manifest_sha256,
            }
            for s in snapshots.list_snapshots(session, attempt_id)
        ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no snapshots")
    for row in rows:
        late = " LATE" if row["late"] else ""
        click.echo(
            f"{row['id']:>6}  {row['kind']:<10} due {_hours(row['due_working_s'])} "
            f"taken {_hours(row['taken_working_s'])}{late}  {row['files']} files "
            f"{row['bytes']} bytes  {row['skipped']} skipped  ({row['source']})"
        )


def _hours(seconds: object) -> str:
    return f"{float(seconds) / 3600:7.3f}h"  # type: ignore[arg-type]


@snapshot.command("export")
@click.argument("snapshot_id", type=int)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The .tar.gz file to write (its folder is made if missing).",
)
@portal_options
def export(snapshot_id: int, out: Path, url: str | None, token: str | None) -> None:
    """Write a snapshot as submission.tar.gz (PaperBench layout: a top folder submission/)."""
    remote = client_for(url, token)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".export-")
    try:
        with os.fdopen(fd, "wb") as handle:
            if remote is not None:
                handle.write(remote.request("GET", f"/snapshots/{snapshot_id}/download"))
            else:
                ctx = _context()
                with ctx.session() as session:
                    store = snapshots.store_for(ctx)
                    snapshots.export_snapshot(session, store, snapshot_id, handle)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    click.echo(f"wrote {out}")


@snapshot.command("diff")
@click.argument("old_id", type=int)
@click.argument("new_id", type=int)
def diff_cmd(old_id: int, new_id: int) -> None:
    """File-level difference between two snapshots of one attempt."""
    ctx = _context()
    with ctx.session() as session:
        change = snapshots.diff_snapshots(session, snapshots.store_for(ctx), old_id, new_id)
    for mark, paths in (("+", change.added), ("-", change.removed), ("M", change.changed)):
        for path in paths:
            click.echo(f"{mark} {path}")
    if change.empty:
        click.echo("no difference")


@snapshot.command("take")
@click.argument("attempt_id", type=int)
def take(attempt_id: int) -> None:
    """Take a manual snapshot now (from the live workspace, else its submission volume)."""
    ctx = _context()
    asked_at = utcnow()
    taken = attempts.manual_snapshot(ctx, attempt_id, None, snapshots.resolve_source)
    click.echo(f"{snapshots.taken_message(taken, asked_at)}, {taken.total_bytes} bytes")


@click.command()
@click.argument("attempt_id", type=int)
@click.option(
    "--reason",
    default=PauseReason.ADMIN.value,
    show_default=True,
    type=click.Choice([r.value for r in PauseReason if r is not PauseReason.NOT_STARTED]),
    help="Why the clock stops (kept with the pause, shown on the monitor).",
)
@click.option("--note", default="", help="Words for the audit log and the monitor.")
@portal_options
def pause(attempt_id: int, reason: str, note: str, url: str | None, token: str | None) -> None:
    """Pause an attempt's working clock."""
    remote = client_for(url, token)
    if remote is not None:
        remote.post(f"/attempts/{attempt_id}/pause", {"reason": reason, "note": note})
    else:
        attempts.pause(_context(), attempt_id, PauseReason(reason), None, note)
    click.echo(f"attempt {attempt_id} paused ({reason})")


@click.command()
@click.argument("attempt_id", type=int)
@portal_options
def resume(attempt_id: int, url: str | None, token: str | None) -> None:
    """Resume an attempt's working clock."""
    remote = client_for(url, token)
    if remote is not None:
        remote.post(f"/attempts/{attempt_id}/resume")
    else:
        attempts.resume(_context(), attempt_id, None)
    click.echo(f"attempt {attempt_id} resumed")


@click.command()
@click.argument("attempt_id", type=int)
@click.option(
    "--hours",
    required=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Working hours to add.",
)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@click.option(
    "--if-limit-is",
    "seen_limit_hours",
    type=click.FloatRange(min=0),
    help="Extend only if the limit is still this many working hours (a script answering one "
    "incident twice, or two coordinators, then add the hours once).",
)
@portal_options
def extend(
    attempt_id: int,
    hours: float,
    reason: str,
    seen_limit_hours: float | None,
    url: str | None,
    token: str | None,
) -> None:
    """Extend an attempt's working-time limit (audited with the reason)."""
    remote = client_for(url, token)
    if remote is not None:
        body: dict[str, object] = {"hours": hours, "reason": reason}
        if seen_limit_hours is not None:
            body["seen_limit_hours"] = seen_limit_hours
        answer = remote.post(f"/attempts/{attempt_id}/extend", body)
        limit = float(answer["attempt"]["working_time_limit_s"])
    else:
        seen_s = None if seen_limit_hours is None else seen_limit_hours * 3600.0
        limit = attempts.extend(_context(), attempt_id, hours * 3600.0, None, reason, seen_s)
    click.echo(f"attempt {attempt_id}: limit now {limit / 3600:g} working hours")


@click.command("submit")
@click.argument("attempt_id", type=int)
@portal_options
def submit(attempt_id: int, url: str | None, token: str | None) -> None:
    """Submit on the participant's behalf: final snapshot, then the clock stops."""
    remote = client_for(url, token)
    if remote is not None:
        final_id = remote.post(f"/attempts/{attempt_id}/submit")["snapshot"]["id"]
    else:
        final_id = attempts.submit(_context(), attempt_id, None, snapshots.resolve_source).id
    click.echo(f"attempt {attempt_id} submitted; final snapshot {final_id}")


@click.command()
@click.argument("attempt_id", type=int)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@portal_options
def disqualify(attempt_id: int, reason: str, url: str | None, token: str | None) -> None:
    """Disqualify an attempt: its clock stops for good; its snapshots are kept."""
    remote = client_for(url, token)
    if remote is not None:
        remote.post(f"/attempts/{attempt_id}/disqualify", {"reason": reason})
    else:
        attempts.disqualify(_context(), attempt_id, None, reason)
    click.echo(f"attempt {attempt_id} disqualified")


@click.command()
@click.argument("attempt_id", type=int)
@click.option("--reason", required=True, help="Why (kept in the audit log).")
@portal_options
def withdraw(attempt_id: int, reason: str, url: str | None, token: str | None) -> None:
    """Withdraw an attempt that never started (assigned by mistake): it is removed, audited."""
    remote = client_for(url, token)
    if remote is not None:
        remote.post(f"/attempts/{attempt_id}/withdraw", {"reason": reason})
    else:
        attempts.withdraw(_context(), attempt_id, None, reason)
    click.echo(f"attempt {attempt_id} withdrawn")


@click.command("clock")
@click.argument("attempt_id", type=int)
@portal_options
def clock_cmd(attempt_id: int, url: str | None, token: str | None) -> None:
    """Show an attempt's working time, limit and pause state."""
    remote = client_for(url, token)
    if remote is not None:
        attempt = remote.get(f"/attempts/{attempt_id}")
        status, now = str(attempt["status"]), attempt["clock"]
        working_s, limit_s = float(now["working_s"]), float(now["limit_s"])
        reason = now["pause_reason"]
    else:
        with _context().session() as session:
            found = session.get(Attempt, attempt_id)
            if found is None:
                raise NotFound(f"no attempt with id {attempt_id}")
            state = clock.state(found)
            status, working_s, limit_s = found.status.value, state.working_s, state.limit_s
            reason = state.pause_reason.value if state.pause_reason else None
    # Waiting for the first login is not a pause anyone took (the portal and `study watch` say
    # "not started" too).
    waiting = reason == PauseReason.NOT_STARTED.value
    paused = " not started" if waiting else f" paused ({reason})" if reason else ""
    click.echo(
        f"attempt {attempt_id} [{status}]{paused}: {working_s / 3600:.3f} of "
        f"{limit_s / 3600:g} working hours used"
    )


@click.command("time")
@click.option("--study", "study_ref", required=True, help="Study name or id.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV for payouts instead of JSON.")
def time_used(study_ref: str, as_csv: bool) -> None:
    """Working time used per attempt, net of pauses (for participant payouts)."""
    with _context().session() as session:
        rows = clock.time_used(session, studies.find_study(session, study_ref).id)
    if as_csv:
        click.echo(clock.time_used_csv(rows), nl=False)
        return
    click.echo(json.dumps([row.__dict__ for row in rows], indent=2))
