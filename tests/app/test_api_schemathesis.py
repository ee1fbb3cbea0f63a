"""Property-based API testing: schemathesis drives every operation of /api/v1/openapi.json.

It must find no 5xx response and no response that violates the documented schema or status
codes, for an admin caller (who may reach every operation), a participant (who is refused most
of them; the refusals must be documented too) and a grader (the blind expert-grading routes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.core.result import Ok

from baseline.context import Context
from baseline.models import (
    Grading,
    GradingKind,
    Reproduction,
    Role,
    Task,
    TaskKind,
)
from baseline.people import accounts
from baseline.studies import studies
from tests.baseline.attempt_world import blobless_final_snapshot
from tests.conftest import Users

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]
EXAMPLES_PER_OPERATION = 30
# An anonymous caller is refused before any input is looked at: a few cases per operation show
# that every refusal is documented and none is a 5xx.
ANONYMOUS_EXAMPLES_PER_OPERATION = 8


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """Schemathesis runs on SQLite only; the model tests cover PostgreSQL."""
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def tokens(ctx: Context, users: Users) -> dict[str, str]:
    with ctx.session() as session:
        admin = session.merge(users[Role.ADMIN])
        participant = session.merge(users[Role.PARTICIPANT])
        grader = session.merge(users[Role.GRADER])
        study = studies.create_study(session, studies.StudySpec(name="Seeded"), admin.id)
        me = studies.enroll_human(session, study.id, participant, admin.id)
        # A task, an attempt and a snapshot (its blobs absent) so that the attempt, snapshot,
        # reproduction and grading operations meet real rows, not only 404s.
        task = Task(slug="seeded", title="Seeded", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, admin.id)
        attempt = studies.create_attempt(session, me, task, admin.id)
        snapshot = blobless_final_snapshot(session, attempt.id)
        session.add_all(
            [
                Reproduction(snapshot_id=snapshot.id, details={}),
                Grading(snapshot_id=snapshot.id, kind=GradingKind.JUDGE, config={}),
            ]
        )
        return {
            "admin": accounts.issue_token(session, admin, "schemathesis"),
            "participant": accounts.issue_token(session, participant, "schemathesis"),
            "grader": accounts.issue_token(session, grader, "schemathesis"),
        }


@pytest.mark.parametrize("caller", ["admin", "participant", "grader", "anonymous"])
def test_every_operation_conforms(app, tokens: dict[str, str], caller: str) -> None:  # type: ignore[no-untyped-def]
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    headers = {} if caller == "anonymous" else {"Authorization": f"Bearer {tokens[caller]}"}
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) >= 40
    examples = ANONYMOUS_EXAMPLES_PER_OPERATION if caller == "anonymous" else EXAMPLES_PER_OPERATION

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        check()
