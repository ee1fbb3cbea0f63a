"""The portal's side of JupyterHub: "Open workspace", and the hub-service routes the hub calls.

- ``POST /attempts/<id>/workspace`` (the participant, own attempt only): issue a one-time login
  token for the hub's ``/hub/login?login_token=...&next=/hub/spawn/...`` (JupyterHub's
  forced-login pattern), which the work page (`app.blueprints.participant`) opens in its frame.
  A hub that does not answer is said so here, not as a proxy error page.
- ``/hub-service/...``: called by the hub's authenticator and spawner only. They are public in the
  role sense (no portal session) and authenticated by the hub's service token instead, compared
  in constant time; without it they answer 403.
"""

from __future__ import annotations

import hmac
from typing import Any, NamedTuple
from urllib.parse import urlencode

from flask import (
    Blueprint,
    flash,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.wrappers import Response

from app.access import PUBLIC, current_user, requires
from app.blueprints import participant
from app.factory import csrf, get_context
from baseline.errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound
from baseline.hub import hub_sessions
from baseline.hub_settings import hub_config
from baseline.models import Attempt, Role, User
from baseline.people import logins
from baseline.workspaces import terminal_records
from infra.hub.hub_api import hub_is_up

bp = Blueprint("hub", __name__)


def _config() -> Any:
    return hub_config(get_context().settings)


class HubLogout(NamedTuple):
    next_url: str | None  # the hub's logout, where a participant's portal logout continues
    warning: str | None  # what the participant must know: their hub session may still be open


def end_hub_session(user: User | None) -> HubLogout:
    """A portal logout ends the user's hub session too (`hub_sessions.end_hub_session`: servers
    stopped, hub tokens and cookie revoked). A participant's logout then goes through the hub's
    logout, which clears the browser's hub cookies and comes back to the portal's login page.
    Staff hold a hub user only after observing: theirs ends too when the hub answers."""
    if user is None:
        return HubLogout(None, None)
    config = _config()
    if user.role is not Role.PARTICIPANT:
        if hub_is_up(config.public_url):
            hub_sessions.end_hub_session(g.db, config.public_url, config.service_token(), user)
        return HubLogout(None, None)
    if hub_sessions.end_hub_session(g.db, config.public_url, config.service_token(), user):
        return HubLogout(f"{config.public_url}/hub/logout", None)
    return HubLogout(
        None,
        "JupyterHub did not answer, so your workspace may stay open: tell the study team.",
    )


@bp.route("/attempts/<int:attempt_id>/workspace", methods=["POST"])
@requires(Role.PARTICIPANT)
def open_workspace(attempt_id: int) -> Any:
    user = current_user()
    assert user is not None
    # Checked before a token exists, so a refusal names the real reason (not live, no workspace).
    attempt, _ = hub_sessions.openable_attempt(g.db, user, attempt_id)
    if not terminal_records.has_consented(attempt.participant):
        # `continue` is a Python keyword, hence the query string written out.
        return redirect(url_for("hub.consent", attempt_id=attempt_id) + "?continue=workspace")
    return _to_the_hub(user, attempt_id)


def _portal_session() -> int:
    """The row of this request's portal session: the hub login about to be made is bound to it."""
    sid = session.get("sid")
    found = logins.live_session_id(g.db, sid) if isinstance(sid, str) else None
    if found is None:  # `requires` let the request in on this very session: it just ended
        raise Forbidden("your portal session has ended: log in again")
    return found


def _to_the_hub(user: User, attempt_id: int) -> Response:
    """Issue the one-time login token and send the browser to the hub's login with it."""
    config = _config()
    if not hub_is_up(config.public_url):
        raise Conflict(
            "JupyterHub is not answering right now; your files are safe. Try again in a minute "
            "or tell the study team."
        )
    grant = hub_sessions.issue_login_token(g.db, user, attempt_id, portal_session=_portal_session())
    g.db.commit()
    query = urlencode({"login_token": grant.token, "next": grant.next_path})
    # On to the work page, in this tab: JupyterLab opens in its frame through this login.
    return participant.enter_work(attempt_id, f"{config.public_url}/hub/login?{query}")


@bp.route("/attempts/<int:attempt_id>/consent", methods=["GET", "POST"])
@requires(Role.PARTICIPANT)
def consent(attempt_id: int) -> Any:
    """The study's consent text (what is recorded), accepted once before the first login."""
    user = current_user()
    assert user is not None
    attempt = g.db.get(Attempt, attempt_id)
    if attempt is None or attempt.participant.user_id != user.id:
        raise NotFound(f"no attempt with id {attempt_id}")
    participant = attempt.participant
    if request.method == "POST":
        if request.form.get("accept") != "yes":
            raise InvalidInput("tick the box to accept the consent text, or close this page")
        terminal_records.accept_consent(g.db, participant, user.id)
        g.db.commit()
        # Accepted on the way in ("Open workspace" sent them here): on into JupyterLab, in this
        # same tab, rather than back to the attempt page to open it again.
        if request.form.get("continue") == "workspace":
            hub_sessions.openable_attempt(g.db, user, attempt_id)
            return _to_the_hub(user, attempt_id)
        flash("Consent recorded. You can open your workspace now.", "success")
        return redirect(url_for("attempts.detail", attempt_id=attempt_id))
    return render_template(
        "attempts/consent.html",
        attempt=attempt,
        text=terminal_records.consent_text(participant),
        accepted=terminal_records.has_consented(participant),
        accepted_at=participant.consent_accepted_at,
        continue_to=request.args.get("continue", ""),
    )


@bp.route("/attempts/<int:attempt_id>/observe", methods=["POST"])
@requires(Role.ADMIN, Role.COORDINATOR)
def observe(attempt_id: int) -> Any:
    """Staff open a participant's JupyterLab: audited, then logged into the hub with access to
    that one server only."""
    user = current_user()
    assert user is not None
    attempt = g.db.get(Attempt, attempt_id)
    if attempt is not None and attempt.first_login_at is None:
        # The hub knows a participant only from their first login: it would answer "404: No
        # such user" (issue 40).
        raise Conflict(
            "the participant has not opened JupyterLab yet, so there is nothing to observe: "
            "it exists from their first login"
        )
    config = _config()
    if not hub_is_up(config.public_url):
        raise Conflict("JupyterHub is not answering right now")
    hub_sessions.check_observable_now(g.db, config.public_url, config.service_token(), attempt_id)
    grant = hub_sessions.issue_observe_token(
        g.db, user, attempt_id, portal_session=_portal_session()
    )
    g.db.commit()
    query = urlencode({"login_token": grant.token, "next": grant.next_path})
    return redirect(f"{config.public_url}/hub/login?{query}")


def _service_call() -> None:
    header = request.headers.get("Authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else ""
    expected = _config().service_token()
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Forbidden("hub-service routes need the hub's service token")


def _error(exc: DomainError) -> Response:
    response = jsonify({"error": exc.code, "message": exc.message})
    response.status_code = exc.status_code
    return response


@bp.route("/hub-service/redeem", methods=["POST"])
@requires(PUBLIC)
@csrf.exempt
def redeem() -> Any:
    """The hub's authenticator spends a login token: who is this, and for which attempt. It names
    the hub's session id of the browser spending it (``hub_session``), the login it makes there."""
    try:
        _service_call()
        body = request.get_json(silent=True) or {}
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise Forbidden("token: required")
        hub_session = body.get("hub_session")
        if not isinstance(hub_session, str) or not hub_session:
            raise InvalidInput("hub_session: required, the hub's session id of the browser")
        redeemed = hub_sessions.redeem_login_token(get_context(), token, hub_session)
    except DomainError as exc:
        return _error(exc)
    answer: dict[str, Any] = {
        "user": redeemed.hub_user,
        "attempt_id": redeemed.attempt_id,
        "clock_started": redeemed.clock_started,
    }
    if redeemed.roles is not None:
        answer["roles"] = redeemed.roles
    return jsonify(answer)


@bp.route("/hub-service/session", methods=["GET"])
@requires(PUBLIC)
def session_live() -> Any:
    """The hub's authenticator asks, at its auth refresh age, whether hub user ?user=uN's login
    in the browser whose hub session id is ?hub_session= still stands on a live portal session
    (the one that made it: expired or revoked, it ends that login). Without ?hub_session= (a
    server's own token): whether the user holds any live portal session."""
    try:
        _service_call()
        live = hub_sessions.portal_session_live(
            g.db, request.args.get("user", ""), request.args.get("hub_session") or None
        )
    except DomainError as exc:
        return _error(exc)
    return jsonify({"live": live})


@bp.route("/hub-service/server", methods=["GET"])
@requires(PUBLIC)
def server() -> Any:
    """The hub's spawner asks where hub user ?user=uN's server ?name=aM runs, if it may."""
    try:
        _service_call()
        target = hub_sessions.server_target(
            g.db, request.args.get("user", ""), request.args.get("name", "")
        )
    except DomainError as exc:
        return _error(exc)
    return jsonify(
        {
            "attempt_id": target.attempt_id,
            "docker_url": target.docker_url,
            "container": target.container,
        }
    )
