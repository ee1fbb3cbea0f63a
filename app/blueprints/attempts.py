"""The attempts area: lists, the timeline page (clock, pauses, checkpoints, snapshots, diffs) and
the clock actions (pause, resume, extend, manual snapshot, first start).

Who sees what: participants their own attempts only (another participant's attempt is a 404),
coordinators and admins all of them. Graders and analysts reach submissions only through their
own blinded areas, so the list is empty for them and the timeline is refused: it shows pauses,
names and timing that would unblind a grader.
"""

from __future__ import annotations

import io
from typing import Any

from flask import (
    Blueprint,
    flash,
    g,
    redirect,
    render_template,
    request,
    send_file,
    url_for,
)
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload
from werkzeug.wrappers import Response

from app import listing
from app.access import ANY_USER, STAFF, current_user, requires
from app.factory import get_context
from app.forms import float_field, text_field
from baseline.attempts import attempts, clock, host_outage, launch, schedule, snapshots
from baseline.errors import Conflict, Forbidden, InvalidInput
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    ParticipantKind,
    PauseReason,
    Role,
    Snapshot,
    TerminalRecording,
    User,
    utcnow,
)
from baseline.people import visibility
from baseline.runs import blacklist_monitor, transcripts
from baseline.workspaces import terminal_records, workspaces

bp = Blueprint("attempts", __name__, url_prefix="/attempts")
# The reasons a person pauses for (the participant's break, the study team's pause): those the
# clock holds the workspace for. The others (rate_limit, scoring, idle, outage, no_driver...) the
# platform sets when it observes them, so a person choosing one would misreport what happened.
MANUAL_REASONS = sorted(clock.HELD_REASONS, key=lambda r: r is not PauseReason.ADMIN)

VIEWERS = (Role.PARTICIPANT, *STAFF)


def _user() -> User:
    user = current_user()
    assert user is not None  # guaranteed by @requires
    return user


def _attempt(attempt_id: int) -> Attempt:
    return visibility.visible_attempt(g.db, _user(), attempt_id)


def _is_staff() -> bool:
    return _user().role in STAFF


def _own(attempt: Attempt) -> bool:
    return attempt.participant.user_id == _user().id


def fmt_hours(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


SORT_KEYS: dict[str, Any] = {
    "id": lambda a, s: a.id,
    "study": lambda a, s: (a.study.name, a.id),
    "task": lambda a, s: (a.task.slug, a.id),
    "participant": lambda a, s: (a.participant.display_name, a.id),
    "status": lambda a, s: (a.status.value, a.id),
    "working": lambda a, s: (s.working_s, a.id),
    "snapshots": lambda a, s: (len(a.snapshots), a.id),
}


@bp.route("/")
@requires(*ANY_USER)
def index() -> Any:
    """The attempts list; graders and analysts are sent to their own (blind) areas instead."""
    if _user().role is Role.GRADER:
        return redirect(url_for("grading.index"))
    if _user().role is Role.ANALYST:
        return redirect(url_for("analysis.index"))
    # One query each for every row's pauses (its clock) and participant, not one per row.
    visible = list(
        g.db.scalars(
            visibility.attempts_query(_user()).options(
                selectinload(Attempt.pauses), selectinload(Attempt.participant)
            )
        )
    )
    study_list = sorted({a.study.id: a.study for a in visible}.values(), key=lambda s: s.id)
    filters = {
        "study": listing.int_arg("study"),
        "status": listing.choice_arg("status", [s.value for s in AttemptStatus]),
        "task": request.args.get("task", "").strip()[:200],
        "kind": listing.choice_arg("kind", [k.value for k in ParticipantKind]),
    }
    rows = [
        a
        for a in visible
        if (filters["study"] is None or a.study_id == filters["study"])
        and (not filters["status"] or a.status.value == filters["status"])
        and (not filters["task"] or a.task.slug == filters["task"])
        and (not filters["kind"] or a.participant.kind.value == filters["kind"])
    ]
    sort = listing.choice_arg("sort", list(SORT_KEYS), "id")
    order = listing.choice_arg("order", ["asc", "desc"], "asc")
    now = utcnow()
    # Only the working-time order needs every row's clock; otherwise the page's rows' suffice.
    by_working = sort == "working"
    states = {a.id: clock.state(a, now) for a in rows} if by_working else {}
    rows.sort(key=lambda a: SORT_KEYS[sort](a, states.get(a.id)), reverse=order == "desc")
    page = listing.page_of(len(rows))
    shown = rows[page.offset : page.offset + page.size]
    if not by_working:
        states = {a.id: clock.state(a, now) for a in shown}
    # The page's snapshot counts, in one query: not every row's snapshots loaded to be counted.
    counted = select(Snapshot.attempt_id, func.count()).group_by(Snapshot.attempt_id)
    taken = dict(g.db.execute(counted.where(Snapshot.attempt_id.in_([a.id for a in shown]))).all())
    return render_template(
        "attempts/index.html",
        attempts=shown,
        page=page,
        studies=study_list,
        tasks=sorted({a.task.slug for a in visible}),
        statuses=[s.value for s in AttemptStatus],
        kinds=[k.value for k in ParticipantKind],
        filters=filters,
        sort=sort,
        order=order,
        link=listing.link,
        states=states,
        snapshot_counts=taken,
        staff=_is_staff(),
        fmt_hours=fmt_hours,
        has_live=any(a.status in LIVE_ATTEMPT_STATUSES for a in visible),
    )


@bp.route("/time.csv")
@requires(*STAFF)
def time_csv() -> Any:
    """Working time used per attempt of a study, net of pauses (?study=ID): for payouts."""
    study_id = request.args.get("study", type=int)
    if study_id is None:
        raise InvalidInput("study: required")
    visibility.visible_study(g.db, _user(), study_id)
    return Response(
        clock.time_used_csv(clock.time_used(g.db, study_id)),
        mimetype="text/csv",
        headers={"Content-Disposition": f"attachment; filename=study-{study_id}-time.csv"},
    )


@bp.route("/<int:attempt_id>")
@requires(*VIEWERS)
def detail(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    store = snapshots.store_for(get_context())
    taken = snapshots.list_snapshots(g.db, attempt.id)
    state = clock.state(attempt)
    points = _points(attempt)
    change = None
    old_id, new_id = request.args.get("a", type=int), request.args.get("b", type=int)
    if old_id is not None and new_id is not None:
        snapshots.get_snapshot(g.db, old_id, attempt.id)
        snapshots.get_snapshot(g.db, new_id, attempt.id)
        change = snapshots.diff_snapshots(g.db, store, old_id, new_id)
    return render_template(
        "attempts/detail.html",
        attempt=attempt,
        state=state,
        pauses=attempt.pauses,
        points=points,
        snapshots=taken,
        change=change,
        old_id=old_id,
        new_id=new_id,
        staff=_is_staff(),
        own=_own(attempt),
        held_reasons=[r.value for r in clock.HELD_REASONS],
        reasons=MANUAL_REASONS,
        next_due=schedule.next_wall_time(attempt),
        blacklist_hits=blacklist_monitor.hits_of(g.db, attempt.id) if _is_staff() else [],
        fmt_hours=fmt_hours,
    )


def _points(attempt: Attempt) -> list[dict[str, Any]]:
    """Every due point with its (estimated) wall time and the snapshot that answered it."""
    by_point = {(s.kind, s.due_working_s): s for s in attempt.snapshots}
    intervals = clock.intervals_of(attempt.pauses)
    rows = []
    for point in schedule.attempt_points(attempt):
        wall = None
        if attempt.started_at is not None:
            wall = clock.wall_at_working(
                attempt.started_at, intervals, point.due_working_s, attempt.time_scale
            )
        rows.append(
            {
                "point": point,
                "wall": wall,
                "snapshot": by_point.get((point.kind, point.due_working_s)),
            }
        )
    return rows


def _back(attempt_id: int) -> Response:
    return redirect(url_for("attempts.detail", attempt_id=attempt_id))


@bp.route("/<int:attempt_id>/launch", methods=["POST"])
@requires(*STAFF)
def launch_attempt(attempt_id: int) -> Any:
    """Place the attempt's workspace and start its clock (or leave it visibly pending)."""
    attempt = _attempt(attempt_id)
    status = launch.launch(get_context(), attempt.id, _user().id)
    if status is AttemptStatus.PENDING:
        flash("No host has room for this attempt yet: it waits, pending, for one.", "info")
    else:
        flash(f"Workspace ready; the attempt is {status.value}.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/begin", methods=["POST"])
@requires(Role.PARTICIPANT)
def begin(attempt_id: int) -> Any:
    """The participant's first login to their attempt: the clock starts running."""
    attempt = _attempt(attempt_id)
    if not _own(attempt):
        raise Conflict("only the attempt's participant starts its clock, by logging in")
    if attempt.started_at is None:
        raise Conflict(
            "your workspace is not ready yet, so your clock has not started: "
            "the study's coordinator launches it"
        )
    if attempts.first_login(get_context(), attempt.id, _user().id):
        flash("Your working clock is running.", "success")
    else:
        flash("Your clock had already started.", "info")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/pause", methods=["POST"])
@requires(*VIEWERS)
def pause(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    if _is_staff():
        raw = request.form.get("reason", PauseReason.ADMIN.value)
        reason = next((r for r in MANUAL_REASONS if r.value == raw), None)
        if reason is None:
            raise InvalidInput(
                f"reason: a person pauses for {' or '.join(r.value for r in MANUAL_REASONS)}; "
                f"{raw!r} is not one (rate_limit, scoring, idle, outage... are set by the platform)"
            )
    else:
        reason = PauseReason.PARTICIPANT
    note = text_field("note", required=False, max_length=500)
    attempts.pause(get_context(), attempt.id, reason, _user().id, note)
    flash(f"Clock paused ({reason.value}).", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/resume", methods=["POST"])
@requires(*VIEWERS)
def resume(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    current = clock.open_pause(attempt)
    if not _is_staff() and current is not None and current.reason is not PauseReason.PARTICIPANT:
        raise Forbidden(
            f"this pause ({current.reason.value}) was set by the study team; they will resume it"
        )
    attempts.resume(get_context(), attempt.id, _user().id)
    flash("Clock resumed.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/extend", methods=["POST"])
@requires(*STAFF)
def extend(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    hours = float_field("hours")
    if hours is None:
        raise InvalidInput("hours: required")
    if not hours > 0:  # in the unit asked for (the domain says seconds)
        raise InvalidInput(f"hours: must be above 0, got {hours:g}")
    reason = text_field("reason", max_length=500)
    # the limit the page showed: a second click, or a second coordinator's form, adds nothing
    seen = float_field("seen_limit_s")
    limit = attempts.extend(get_context(), attempt.id, hours * 3600.0, _user().id, reason, seen)
    flash(f"Limit extended to {fmt_hours(limit)} working time.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/disqualify", methods=["POST"])
@requires(*STAFF)
def disqualify(attempt_id: int) -> Any:
    """End the attempt for good on a breach of the rules (a blacklist hit reviewed, say); its
    snapshots stay as evidence. It took the CLI on the portal's machine."""
    attempt = _attempt(attempt_id)
    reason = text_field("reason", max_length=500)
    attempts.disqualify(get_context(), attempt.id, _user().id, reason)
    flash("Attempt disqualified: its clock stopped for good; its snapshots are kept.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/withdraw", methods=["POST"])
@requires(*STAFF)
def withdraw(attempt_id: int) -> Any:
    """Remove an attempt assigned by mistake, before it started (`attempts.withdraw`)."""
    attempt = _attempt(attempt_id)
    study_id = attempt.study_id
    reason = text_field("reason", max_length=500)
    attempts.withdraw(get_context(), attempt.id, _user().id, reason)
    flash(
        f"Attempt {attempt_id} withdrawn (it never started); the audit trail keeps why.", "success"
    )
    return redirect(url_for("studies.detail", study_id=study_id))


@bp.route("/<int:attempt_id>/move", methods=["POST"])
@requires(*STAFF)
def move_host(attempt_id: int) -> Any:
    """Move the attempt off a lost host, from its latest snapshot
    (`baseline.attempts.host_outage`)."""
    attempt = _attempt(attempt_id)
    target = text_field("host", required=False, max_length=100) or None
    workspace, host = host_outage.move(get_context(), attempt.id, target, _user().id)
    flash(f"Moved to {host} ({workspace.name}) from the latest snapshot.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/snapshot", methods=["POST"])
@requires(*STAFF)
def take_snapshot(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    asked_at = utcnow()
    taken = attempts.manual_snapshot(
        get_context(), attempt.id, _user().id, snapshots.resolve_source
    )
    message = snapshots.taken_message(taken, asked_at)
    flash(f"{message[0].upper()}{message[1:]}.", "success")
    return _back(attempt.id)


@bp.route("/<int:attempt_id>/export")
@requires(*VIEWERS)
def export(attempt_id: int) -> Any:
    """Download one snapshot as submission.tar.gz (?snapshot=ID)."""
    attempt = _attempt(attempt_id)
    snapshot_id = request.args.get("snapshot", type=int)
    if snapshot_id is None:
        raise InvalidInput("snapshot: required")
    snapshot = snapshots.get_snapshot(g.db, snapshot_id, attempt.id)
    buffer = io.BytesIO()
    snapshots.export_snapshot(g.db, snapshots.store_for(get_context()), snapshot.id, buffer)
    buffer.seek(0)
    return send_file(
        buffer,
        mimetype="application/gzip",
        as_attachment=True,
        download_name=f"attempt-{attempt.id}-snapshot-{snapshot.id}-submission.tar.gz",
    )


@bp.route("/<int:attempt_id>/transcript")
@requires(*STAFF)
def transcript(attempt_id: int) -> Any:
    """An agent's transcript, step by step on the attempt's timeline (coordinators only)."""
    attempt = _attempt(attempt_id)
    run, rows = transcripts.timeline(g.db, attempt)
    return render_template(
        "attempts/transcript.html", attempt=attempt, run=run, rows=rows, fmt_hours=fmt_hours
    )


def _recording_text(row: TerminalRecording) -> str:
    """A typescript as readable text: its terminal escape sequences are dropped."""
    return terminal_records.printable(row.content)


@bp.route("/<int:attempt_id>/terminal")
@requires(*STAFF)
def terminal(attempt_id: int) -> Any:
    """A human's terminal sessions and shell history on the attempt's timeline (coordinators
    only: graders never see who worked or how)."""
    attempt = _attempt(attempt_id)
    rows = terminal_records.recordings(g.db, attempt.id)
    return render_template(
        "attempts/terminal.html",
        attempt=attempt,
        rows=rows,
        tampered=terminal_records.tampered(rows),
        interruptions=terminal_records.interruptions(rows),
        text_of=_recording_text,
    )


@bp.route("/<int:attempt_id>/terminal/collect", methods=["POST"])
@requires(*STAFF)
def collect_terminal(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    count = terminal_records.collect(g.db, attempt.id, workspaces.backend_for_host, _user().id)
    g.db.commit()
    flash(f"Collected {count} file(s) from the workspace.", "success")
    return redirect(url_for("attempts.terminal", attempt_id=attempt.id))


@bp.route("/<int:attempt_id>/transcript.jsonl")
@requires(*STAFF)
def transcript_jsonl(attempt_id: int) -> Any:
    attempt = _attempt(attempt_id)
    return Response(
        transcripts.export_jsonl(g.db, attempt.id),
        mimetype="application/x-ndjson",
        headers={
            "Content-Disposition": f"attachment; filename=attempt-{attempt.id}-transcript.jsonl"
        },
    )
