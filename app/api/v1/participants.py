"""A study's participants, and enrolling agent configurations."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Dict, Integer, List, Nested, String
from apiflask.validators import Length
from flask import g

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, user
from baseline import studies
from baseline.models import Participant


class ParticipantOut(Schema):
    id = Integer(required=True)
    kind = String(required=True)
    display_name = String(required=True)
    pseudonym = String(required=True)
    group = String(required=True)
    agent_model = String(allow_none=True)
    agent_scaffold = String(allow_none=True)


class AgentIn(Schema):
    name = String(required=True, validate=Length(1, 200))
    scaffold = String(required=True, validate=Length(1, 100))
    model = String(required=True, validate=Length(1, 200))
    endpoint = String(load_default="", validate=Length(0, 500))
    limits = Dict(load_default=dict)


class ParticipantListOut(Schema):
    participants = List(Nested(ParticipantOut), required=True)


def participant_out(p: Participant) -> dict[str, Any]:
    return {
        "id": p.id,
        "kind": p.kind.value,
        "display_name": p.display_name,
        "pseudonym": p.pseudonym,
        "group": p.group,
        "agent_model": p.agent_model,
        "agent_scaffold": p.agent_scaffold,
    }


@bp.get("/studies/<int:study_id>/participants")
@requires(*STAFF)
@bp.output(ParticipantListOut)
@bp.doc(summary="Participants of a study", responses=AUTH_ERRORS, security=BEARER)
def list_participants(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    return {"participants": [participant_out(p) for p in study.participants]}


@bp.post("/studies/<int:study_id>/agents")
@requires(*STAFF)
@bp.input(AgentIn, arg_name="body")
@bp.output(ParticipantOut, status_code=201)
@bp.doc(summary="Enrol an agent configuration", responses=AUTH_ERRORS, security=BEARER)
def add_agent(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    participant = studies.add_agent(
        g.db,
        study,
        body["name"],
        body["scaffold"],
        body["model"],
        body["endpoint"],
        body["limits"],
        user().id,
    )
    commit()
    return participant_out(participant)
