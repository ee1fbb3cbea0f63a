"""The participant's own pages and actions on their attempt that are not clock controls: submit;
where a participant lands after logging in (their attempt, not the studies list); and the work
page, where they work.

Submitting is final (the final snapshot is taken and the clock stops), so the form must carry an
explicit confirmation; without it nothing happens and the page says why.

The work page (``/attempts/<id>/work``) is JupyterLab under a thin bar of the portal's: the
working time and the limit (ticking, paused shown), pause and resume, the paper, the attempt
page. "Start working" leads there in the same tab, so the path from login to JupyterLab is one
tab. JupyterLab is in a frame of the hub's origin (the hub's and the servers' pages allow the
portal's origin as their only framer, `infra.hub.config.frame_ancestors`; the portal's policy
allows the hub as its only frame source, `app.security`). The bar asks ``work/state`` every few
seconds: when the attempt ends the frame is removed and the page says that the attempt has
ended (not JupyterLab's "Kernel died unexpectedly"); while the hub does not answer (a restart)
the bar says JupyterLab is reconnecting, where JupyterLab itself stays quiet (Baseline's
JupyterLab extension, infra/images/labextensions).
"""

from __future__ import annotations

from typing import Any

from flask import (
    Blueprint,
    current_app,
    flash,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from pydantic import BaseModel
from werkzeug.wrappers import Response

from app.access import current_user, requires
from app.blueprints.attempts import fmt_hours
from app.factory import get_context
from app.formatting import words
from baseline.attempts import attempts, clock, schedule, snapshots
from baseline.errors import InvalidInput, NotFound
from baseline.hub import hub_sessions
from baseline.hub_settings import hub_config
from baseline.models import LIVE_ATTEMPT_STATUSES, Attempt, AttemptStatus, PauseReason, Role
from baseline.people import visibility
from infra.hub.health import SharedHubHealth
from infra.hub.hub_api import hub_is_up

bp = Blueprint("participant", __name__, url_prefix="/attempts")
# Where "Start working" leaves the hub's one-time login URL for the work page to open (the
# session, not the page's address: a reload, the history or a shared link never carries it).
WORK_ENTRY = "work_entry"
# How often the work page asks for the attempt's state, in milliseconds.
STATE_EVERY_MS = 3000
# The app's shared readings of the hub's health, one per hub address.
HUB_HEALTH = "baseline.hub_health"


@bp.route("/<int:attempt_id>/submit", methods=["POST"])
@requires(Role.PARTICIPANT)
def submit(attempt_id: int) -> Any:
    attempt = _own_attempt(attempt_id)
    if request.form.get("confirm") != "yes":
        raise InvalidInput("confirm: tick the box to confirm that your submission is final")
    final = attempts.submit(
        get_context(), attempt.id, attempt.participant.user_id, snapshots.resolve_source
    )
    flash(f"Submitted: final snapshot {final.id} with {final.file_count} files.", "success")
    return redirect(url_for("attempts.detail", attempt_id=attempt.id))


@bp.route("/mine")
@requires(Role.PARTICIPANT)
def landing() -> Any:
    """Where a participant's login leads: the attempt they work on (the latest live one, else
    their latest), or their attempts list when they have none. A first-time participant lands
    where "Start working" is, not on a list of studies."""
    user = current_user()
    assert user is not None
    own = list(g.db.scalars(visibility.attempts_query(user)))
    chosen = [a for a in own if schedule.is_live(a)] or own
    if not chosen:
        return redirect(url_for("attempts.index"))
    return redirect(url_for("attempts.detail", attempt_id=chosen[-1].id))


def _own_attempt(attempt_id: int) -> Attempt:
    user = current_user()
    assert user is not None
    attempt = visibility.visible_attempt(g.db, user, attempt_id)
    if attempt.participant.user_id != user.id:
        raise NotFound(f"no attempt with id {attempt_id}")
    return attempt


def enter_work(attempt_id: int, login_url: str) -> Response:
    """Send the participant to the work page, which opens JupyterLab through `login_url` (the
    hub's one-time login for this attempt) in its frame; the page spends it on its first load."""
    session[WORK_ENTRY] = {"attempt_id": attempt_id, "url": login_url}
    return redirect(url_for("participant.work", attempt_id=attempt_id))


class WorkState(BaseModel):
    """What the work page's bar shows, as ``work/state`` answers it."""

    status: str  # the attempt's status
    label: str  # the clock's state in words: not started, running, paused (reason), ended
    working_s: float
    limit_s: float
    rate: float  # working seconds per real second now (the time scale while it runs, else 0)
    paused: bool
    held: bool  # paused for a reason that holds the workspace's processes still
    can_pause: bool
    can_resume: bool  # the participant's own pause: they may end it
    ended: bool
    end_reason: str
    hub_up: bool  # JupyterLab is reachable (False: the hub is down or restarting)
    notice: str  # what the participant must know now, in words ("" when nothing)


# What a pause means for the participant, by its reason (those they cannot end themselves).
PAUSE_NOTICES = {
    PauseReason.IDLE: "Paused: nothing happened in the workspace for a while. Work on, and the "
    "clock resumes.",
    PauseReason.SCORING: "Paused while your submission is scored.",
    PauseReason.OUTAGE: "Paused: the workspace cannot be reached; the clock waits for it.",
    PauseReason.ADMIN: "Paused by the study team: the workspace is held still until they "
    "resume it.",
}
HELD_NOTICE = "Paused: the workspace is held still; its processes go on when you resume."
RECONNECTING = (
    "Reconnecting to JupyterLab: the hub is restarting. Your files and running processes are safe."
)


def _hub_health() -> SharedHubHealth:
    """The portal process's shared reading of the hub's health (`infra.hub.health`: every work
    page polls it, and a down hub must not hold a request thread per poll)."""
    public_url = hub_config(get_context().settings).public_url
    shared: dict[str, SharedHubHealth] = current_app.extensions.setdefault(HUB_HEALTH, {})
    return shared.setdefault(public_url, SharedHubHealth(lambda: hub_is_up(public_url)))


def work_state(attempt: Attempt) -> WorkState:
    """The bar's state of `attempt` now."""
    state = clock.state(attempt)
    live = attempt.status in LIVE_ATTEMPT_STATUSES
    running = attempt.status is AttemptStatus.RUNNING and not state.paused
    reason = state.pause_reason
    if not live:
        label = "ended"
    elif reason is PauseReason.NOT_STARTED or attempt.started_at is None:
        label = "not started"
    elif reason is not None:
        label = f"paused ({words(reason.value)})"
    else:
        label = "running"
    hub_up = _hub_health().is_up() if live else True
    notices = []
    if state.paused and reason is not PauseReason.NOT_STARTED:
        if reason is PauseReason.PARTICIPANT:
            notices.append(HELD_NOTICE)
        elif reason is not None:
            notices.append(PAUSE_NOTICES.get(reason, f"Paused ({words(reason.value)})."))
    if not hub_up:
        notices.append(RECONNECTING)
    return WorkState(
        status=attempt.status.value,
        label=label,
        working_s=state.working_s,
        limit_s=state.limit_s,
        rate=attempt.time_scale if running and not state.limit_reached else 0.0,
        paused=state.paused,
        held=reason in clock.HELD_REASONS,
        can_pause=running,
        can_resume=reason is PauseReason.PARTICIPANT,
        ended=not live,
        end_reason=attempt.end_reason or "",
        hub_up=hub_up,
        notice=" ".join(notices),
    )


@bp.route("/<int:attempt_id>/work")
@requires(Role.PARTICIPANT)
def work(attempt_id: int) -> Any:
    """The work page: JupyterLab under the portal's bar (see the module's docstring)."""
    attempt = _own_attempt(attempt_id)
    entry = session.pop(WORK_ENTRY, None)
    lab_url = None
    if attempt.status in LIVE_ATTEMPT_STATUSES:
        if isinstance(entry, dict) and entry.get("attempt_id") == attempt.id:
            lab_url = str(entry["url"])
        elif attempt.first_login_at is not None:  # a reload: the hub's session is still open
            public_url = hub_config(get_context().settings).public_url
            lab_url = public_url + hub_sessions.observe_path(attempt)
    return render_template(
        "attempts/work.html",
        attempt=attempt,
        lab_url=lab_url,
        state=work_state(attempt),
        every_ms=STATE_EVERY_MS,
        fmt_hours=fmt_hours,
    )


@bp.route("/<int:attempt_id>/work/state")
@requires(Role.PARTICIPANT)
def bar_state(attempt_id: int) -> Any:
    """The work page's bar: the attempt's clock and whether JupyterLab is reachable."""
    response = jsonify(work_state(_own_attempt(attempt_id)).model_dump())
    response.headers["Cache-Control"] = "no-store"
    return response
