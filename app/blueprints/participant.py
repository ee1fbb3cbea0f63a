"""The participant's own actions on their attempt page that are not clock controls: submit; and
where a participant lands after logging in (their attempt, not the studies list).

Submitting is final (the final snapshot is taken and the clock stops), so the form must carry an
explicit confirmation; without it nothing happens and the page says why.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, g, redirect, request, url_for

from app.access import current_user, requires
from app.factory import get_context
from baseline.attempts import attempts, schedule, snapshots
from baseline.errors import InvalidInput, NotFound
from baseline.models import Role
from baseline.people import visibility

bp = Blueprint("participant", __name__, url_prefix="/attempts")


@bp.route("/<int:attempt_id>/submit", methods=["POST"])
@requires(Role.PARTICIPANT)
def submit(attempt_id: int) -> Any:
    user = current_user()
    assert user is not None
    attempt = visibility.visible_attempt(g.db, user, attempt_id)
    if attempt.participant.user_id != user.id:
        raise NotFound(f"no attempt with id {attempt_id}")
    if request.form.get("confirm") != "yes":
        raise InvalidInput("confirm: tick the box to confirm that your submission is final")
    final = attempts.submit(get_context(), attempt.id, user.id, snapshots.resolve_source)
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
