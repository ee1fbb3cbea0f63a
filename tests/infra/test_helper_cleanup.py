"""When `DockerBackend.reconcile` may remove a capture's helper container: only once it has been
stopped long enough that no capture can still be reading its results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from docker.models.containers import Container

from infra.docker_backend import HELPER_STOPPED_GRACE_S, _stopped_for


def _container(state: dict[str, Any]) -> Container:
    return cast(Container, type("Fake", (), {"attrs": {"State": state}})())


def test_a_running_helper_is_never_stale() -> None:
    assert _stopped_for(_container({"Running": True, "FinishedAt": "0001-01-01T00:00:00Z"})) == 0


def test_a_helper_stopped_a_moment_ago_is_kept_and_an_old_one_is_stale() -> None:
    now = datetime.now(UTC)
    recent = (now - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    old = (now - timedelta(seconds=2 * HELPER_STOPPED_GRACE_S)).isoformat()
    assert _stopped_for(_container({"Running": False, "FinishedAt": recent})) < 60
    assert _stopped_for(_container({"Running": False, "FinishedAt": old})) > HELPER_STOPPED_GRACE_S


def test_a_helper_that_never_ran_is_stale() -> None:
    never = _container({"Running": False, "FinishedAt": "0001-01-01T00:00:00Z"})
    assert _stopped_for(never) > HELPER_STOPPED_GRACE_S
    assert _stopped_for(_container({})) > HELPER_STOPPED_GRACE_S
