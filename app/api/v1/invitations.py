"""Invitations to a study: the secret URL is returned once, at creation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apiflask import Schema
from apiflask.fields import DateTime, Float, Integer, String
from apiflask.validators import Length, OneOf, Range
from flask import g, url_for

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, user
from baseline.errors import Forbidden
from baseline.models import Role
from baseline.people import accounts
from baseline.studies import studies


class InvitationIn(Schema):
    role = String(load_default="participant", validate=OneOf([r.value for r in Role]))
    email = String(load_default=None, allow_none=True, validate=Length(3, 320))
    ttl_hours = Float(load_default=72.0, validate=Range(min=0, min_inclusive=False, max=24 * 365))


class InvitationOut(Schema):
    id = Integer(required=True)
    url = String(required=True)
    role = String(required=True)
    expires_at = DateTime(required=True)


@bp.post("/studies/<int:study_id>/invitations")
@requires(*STAFF)
@bp.input(InvitationIn, arg_name="body")
@bp.output(InvitationOut, status_code=201)
@bp.doc(
    summary="Invite someone; the URL is shown once (a participant only to a study that is open)",
    responses=[*AUTH_ERRORS, 409],
    security=BEARER,
)
def invite(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    role = Role(body["role"])
    if role is Role.ADMIN and user().role is not Role.ADMIN:
        raise Forbidden("only an admin may invite an admin")
    invitation, secret = accounts.create_invitation(
        g.db, role, timedelta(hours=body["ttl_hours"]), user().id, study.id, body["email"]
    )
    commit()
    return {
        "id": invitation.id,
        "url": url_for("auth.invitation", token=secret, _external=True),
        "role": invitation.role.value,
        "expires_at": invitation.expires_at,
    }
