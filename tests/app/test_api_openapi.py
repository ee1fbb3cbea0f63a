"""The OpenAPI document: operations grouped by resource, each schema under one name."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from app.api.v1.openapi import fold_duplicate_schemas
from tests.conftest import json_of

pytestmark = pytest.mark.sqlite_only("the API's description, not the storage")

RESOURCES = {
    "Archives", "Attempts", "Gradings", "Health", "Invitations", "Monitor", "Participants",
    "Planning", "Reproductions", "Results", "Snapshots", "Studies", "Tasks", "Users", "Workspace",
}  # fmt: skip


def _document(client: FlaskClient) -> dict[str, Any]:
    spec: dict[str, Any] = json_of(client.get("/api/v1/openapi.json"))
    return spec


def test_every_operation_is_grouped_under_its_resource(client: FlaskClient) -> None:
    """All of them were under one tag, "Api"."""
    spec = _document(client)
    tags = {
        path: {method: operation["tags"] for method, operation in operations.items()}
        for path, operations in spec["paths"].items()
    }
    assert tags["/api/v1/attempts/{attempt_id}/pause"] == {"post": ["Attempts"]}
    assert tags["/api/v1/attempts/{attempt_id}/workspace/exec"] == {"post": ["Workspace"]}
    assert tags["/api/v1/studies/{study_id}/tasks"] == {"get": ["Tasks"], "post": ["Tasks"]}
    used = {tag for by_method in tags.values() for names in by_method.values() for tag in names}
    assert used == RESOURCES
    described = {tag["name"]: tag["description"] for tag in spec["tags"]}
    assert set(described) == RESOURCES
    assert described["Studies"] == "Studies: list, create, read, change status"


def test_each_schema_has_one_name_and_every_reference_resolves(client: FlaskClient) -> None:
    """A schema a list's items use before an endpoint returns it alone was also `StudyOut1`, and
    the workspace's pause body was `PauseIn1` beside the attempt page's `PauseIn`."""
    spec = _document(client)
    schemas = spec["components"]["schemas"]
    numbered = [name for name in schemas if re.fullmatch(r".*\D\d+", name)]
    assert numbered == []
    assert {"StudyOut", "TaskOut", "AttemptOut", "PauseIn", "OwnPauseIn"} <= set(schemas)
    references = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(spec)))
    assert references <= set(schemas)
    single = spec["paths"]["/api/v1/studies/{study_id}"]["get"]["responses"]["200"]
    assert single["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StudyOut"
    }


def test_only_identical_copies_are_folded() -> None:
    ref = "#/components/schemas/"
    spec = {
        "paths": {"/a": {"get": {"x": {"$ref": ref + "X1"}, "y": {"$ref": ref + "Y1"}}}},
        "components": {
            "schemas": {
                "X": {"type": "string"},
                "X1": {"type": "string"},
                "Y": {"type": "string"},
                "Y1": {"type": "integer"},
            }
        },
    }
    folded = fold_duplicate_schemas(spec)
    assert folded["paths"]["/a"]["get"] == {"x": {"$ref": ref + "X"}, "y": {"$ref": ref + "Y1"}}
    assert set(folded["components"]["schemas"]) == {"X", "Y", "Y1"}
