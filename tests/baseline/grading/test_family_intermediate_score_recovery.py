"""A Task Standard family's intermediate score whose process died mid-scoring leaves nothing on
its attempt's host for good: its row names its scoring run, and recovery removes the run's
container and the state saved for it.

Before, such a score ran in a container of Docker's own random name, in a state image of a
random tag: a portal killed while it scored left that container running on (nothing kills it at
the time-out) and the state image, a copy of the workspace's whole file system, on the engine for
good. Recovery closed the row, which named neither.

SQLite-only and without Docker: the engine is a set of container names and image tags behind a
stand-in client, which the dying process's own clean-up never reaches."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest.mock import MagicMock

import docker
import pytest
from docker.errors import ImageNotFound, NotFound
from requests.exceptions import ConnectionError as RequestsConnectionError

from baseline.attempts import attempts
from baseline.context import Context
from baseline.grading import claims, grading_recovery, script_scoring
from baseline.models import Host, JobStatus, PauseReason, ScoreLog, utcnow
from baseline.workspaces.backends import DEPLOYMENT_LABEL
from baseline.workspaces.workspaces import BackendFactory
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.family_run import (
    RUN_LABEL,
    SCORING_RUN_PREFIX,
    STATE_REPOSITORY,
    scoring_run_name,
    scoring_state_tag,
)
from infra.workspace import WorkspaceBackend
from tests.baseline.grading.test_intermediate_score_recovery import _open_pause
from tests.baseline.tasks.test_task_family_scoring_gpus import _family_attempt

pytestmark = pytest.mark.sqlite_only("an intermediate score's rows, on a stand-in engine")

LATER = timedelta(seconds=claims.STALE_AFTER_S + 1)
AFTER_GRACE = timedelta(seconds=claims.UNNAMED_GRACE_S + 1)
WORKSPACE_CONTAINER = "c" * 64  # the attempt's workspace's (`_family_attempt`)


class _Killed(BaseException):
    """The portal's process dies mid-scoring: nothing after this line of it runs."""


class ScoringContainer:
    """A scoring container on `Engine`; the hook prints 1.0 once `while_scoring` returns."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine, self.name = engine, name

    def put_archive(self, path: str, data: bytes) -> bool:
        return True

    def start(self) -> None:
        return None

    def wait(self, timeout: float) -> dict[str, int]:
        self.engine.while_scoring()
        return {"StatusCode": 0}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b"1.0\n" if stdout else b""

    def remove(self, force: bool) -> None:
        self.engine.reach()
        if not self.engine.dead:
            self.engine.containers.discard(self.name)


class Engine:
    """The attempt's host's engine: its containers by name and its images by tag. `dead`: the
    scoring's process died, so its own clean-up (run_once's and score_in_environment's
    `finally`) never reaches the engine; `down`: the engine does not answer anyone."""

    def __init__(self, while_scoring: Callable[[], None] = lambda: None) -> None:
        self.containers: set[str] = set()
        self.images: set[str] = set()
        self.labels: dict[str, dict[str, str]] = {}  # of each container and image
        self.made = time.time()  # when everything on this engine was made
        self.while_scoring = while_scoring
        self.dead = self.down = False
        self.client = MagicMock(spec=docker.DockerClient)
        self.client.api = MagicMock()
        self.client.api.containers.side_effect = self._list_containers
        self.client.api.images.side_effect = self._list_images
        self.client.containers.get.side_effect = self._get
        self.client.containers.create.side_effect = self._create
        self.client.images.remove.side_effect = self._remove_image

    def reach(self) -> None:
        if self.down:
            raise RequestsConnectionError("the engine does not answer")

    def _get(self, name: str) -> Any:
        self.reach()
        if name == WORKSPACE_CONTAINER:
            workspace = MagicMock()
            workspace.commit.side_effect = self._commit
            return workspace
        if name not in self.containers:
            raise NotFound(f"no container {name}")
        return ScoringContainer(self, name)

    def _labelled(self, key: str, wanted: list[str]) -> bool:
        labels = self.labels.get(key, {})
        return all(
            label in labels or label in (f"{k}={v}" for k, v in labels.items()) for label in wanted
        )

    def _list_containers(self, all: bool, filters: dict[str, Any]) -> list[dict[str, Any]]:
        self.reach()
        assert all and filters["name"] == SCORING_RUN_PREFIX and RUN_LABEL in filters["label"]
        return [
            {"Names": [f"/{name}"], "Created": int(self.made)}
            for name in self.containers
            if self._labelled(name, filters["label"])
        ]

    def _list_images(self, name: str, filters: dict[str, Any]) -> list[dict[str, Any]]:
        self.reach()
        return [
            {"RepoTags": [tag], "Created": int(self.made)}
            for tag in self.images
            if tag.startswith(f"{name}:") and self._labelled(tag, filters["label"])
        ]

    def _commit(self, repository: str, tag: str, conf: dict[str, Any]) -> Any:
        self.images.add(f"{repository}:{tag}")
        self.labels[f"{repository}:{tag}"] = conf["Labels"]
        return MagicMock(id="sha256:state")

    def _create(self, image: str, command: list[str], **options: Any) -> ScoringContainer:
        self.reach()
        name = options.get("name") or f"docker-random-name-{len(self.containers)}"
        self.containers.add(name)
        self.labels[name] = options.get("labels") or {}
        return ScoringContainer(self, name)

    def _remove_image(self, tag: str, force: bool) -> None:
        self.reach()
        if self.dead:
            return
        if tag not in self.images:
            raise ImageNotFound(f"no image {tag}")
        self.images.discard(tag)

    def factory(self) -> BackendFactory:
        def backend_factory(_host: Host) -> WorkspaceBackend:
            return DockerBackend(self.client, local=True)

        return backend_factory


def _ask(ctx: Context, attempt_id: int, engine: Engine, tmp_path: Any) -> ScoreLog:
    return script_scoring.intermediate_score(
        ctx,
        attempt_id,
        None,
        backend_factory=engine.factory(),
        resolver=lambda _session, _attempt: MagicMock(),
        store=BlobStore(tmp_path),
    )


def _die(engine: Engine) -> Callable[[], None]:
    def die() -> None:
        engine.dead = True
        raise _Killed

    return die


def _killed_while_scoring(
    ctx: Context, attempt_id: int, engine: Engine, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Ask for the score and kill the process while the hook runs; the name its row keeps,
    checked to name what it left on the engine."""
    engine.while_scoring = _die(engine)
    with monkeypatch.context() as dying:
        dying.setattr(attempts, "resume_if", lambda *_args: False)
        with pytest.raises(_Killed):
            _ask(ctx, attempt_id, engine, tmp_path)
    engine.dead = False
    (row,) = _logs(ctx, attempt_id)
    assert row.status is JobStatus.RUNNING
    assert row.workspace is not None, "the row names nothing the scoring left"
    assert engine.containers == {row.workspace}
    assert engine.images == {f"{STATE_REPOSITORY}:{row.workspace}"}
    return row.workspace


def _logs(ctx: Context, attempt_id: int) -> list[ScoreLog]:
    with ctx.session() as session:
        return script_scoring.score_logs(session, attempt_id)


def test_recovery_removes_the_container_and_state_a_killed_family_score_left(
    ctx: Context, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while its hook ran: the scoring container stood (running on) and its state image
    stayed, both named after the name on the row. Recovery removes both from the attempt's host,
    closes the score as interrupted and ends the scoring pause."""
    attempt_id, _host_id = _family_attempt(ctx, live=True, held=(0,))
    engine = Engine()
    _killed_while_scoring(ctx, attempt_id, engine, tmp_path, monkeypatch)
    assert _open_pause(ctx, attempt_id) is PauseReason.SCORING

    recovered = grading_recovery.recover_intermediate_scores(
        ctx, backend_factory=engine.factory(), now=utcnow() + LATER
    )
    (closed,) = _logs(ctx, attempt_id)
    assert recovered == [closed.id]
    assert (engine.containers, engine.images) == (set(), set())
    assert closed.status is JobStatus.FAILED and closed.normalised_score is None
    assert (closed.error or "").startswith("interrupted: its process stopped")
    assert _open_pause(ctx, attempt_id) is None


def test_a_live_family_score_keeps_its_container_and_state_until_it_ends(
    ctx: Context, tmp_path: Any
) -> None:
    """While the hook runs, the row names its container and state image; recovery and the sweep
    leave them alone, and the scoring removes both when it ends."""
    attempt_id, _host_id = _family_attempt(ctx, live=True, held=(0,))
    seen: list[tuple[Any, ...]] = []

    def while_scoring() -> None:
        assert grading_recovery.recover_intermediate_scores(ctx, backend_factory=factory) == []
        assert grading_recovery.sweep(ctx, factory, utcnow() + AFTER_GRACE) == []
        (row,) = _logs(ctx, attempt_id)
        seen.append((row.status, row.workspace, set(engine.containers), set(engine.images)))

    engine = Engine(while_scoring)
    factory = engine.factory()
    entry = _ask(ctx, attempt_id, engine, tmp_path)
    assert entry.status is JobStatus.SUCCEEDED and entry.raw_score == 1.0
    name = entry.workspace
    assert name is not None
    assert seen == [(JobStatus.RUNNING, name, {name}, {f"{STATE_REPOSITORY}:{name}"})]
    assert (engine.containers, engine.images) == (set(), set())


def test_an_engine_that_does_not_answer_does_not_keep_the_score_running(
    ctx: Context, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The attempt's host does not answer when recovery runs: the score is closed and the clock
    runs again all the same; the run is left on the engine, its name logged. Once the host
    answers again, the sweep removes the run's container and state (no running row holds it),
    but not before the grace an unnamed run gets, and never another deployment's run."""
    attempt_id, _host_id = _family_attempt(ctx, live=True, held=(0,))
    engine = Engine()
    name = _killed_while_scoring(ctx, attempt_id, engine, tmp_path, monkeypatch)
    engine.down = True
    recovered = grading_recovery.recover_intermediate_scores(
        ctx, backend_factory=engine.factory(), now=utcnow() + LATER
    )
    (closed,) = _logs(ctx, attempt_id)
    assert recovered == [closed.id] and closed.status is JobStatus.FAILED
    assert _open_pause(ctx, attempt_id) is None
    assert engine.containers == {name}
    assert f"scoring run {name} not removed from host gpu-host" in caplog.text

    factory = engine.factory()
    assert grading_recovery.sweep(ctx, factory, utcnow() + AFTER_GRACE) == []  # still down
    engine.down = False
    assert grading_recovery.sweep(ctx, factory, utcnow()) == []  # made within the grace
    assert engine.containers == {name}
    other = scoring_run_name()  # another portal's (deployment's) run on the same engine
    engine.containers.add(other)
    engine.images.add(scoring_state_tag(other))
    foreign = {RUN_LABEL: "1", DEPLOYMENT_LABEL: "home-another-portal"}
    engine.labels[other] = engine.labels[scoring_state_tag(other)] = foreign
    assert grading_recovery.sweep(ctx, factory, utcnow() + AFTER_GRACE) == [name]
    assert (engine.containers, engine.images) == ({other}, {scoring_state_tag(other)})


def test_the_sweep_asks_only_hosts_a_scoring_run_was_ever_named_for(
    ctx: Context, tmp_path: Any
) -> None:
    """A family attempt whose scores were never asked: no row names a scoring run, so the
    sweep does not ask its host's engine for any (most hosts never hold one); once a score was
    asked, it does."""
    attempt_id, _host_id = _family_attempt(ctx, live=True, held=(0,))
    engine = Engine()
    factory = engine.factory()
    assert grading_recovery.sweep(ctx, factory, utcnow() + AFTER_GRACE) == []
    engine.client.api.containers.assert_not_called()
    _ask(ctx, attempt_id, engine, tmp_path)
    assert grading_recovery.sweep(ctx, factory, utcnow() + AFTER_GRACE) == []
    engine.client.api.containers.assert_called_once()
