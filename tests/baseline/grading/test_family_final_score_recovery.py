"""A Task Standard family's final score whose process died mid-scoring leaves nothing on its
attempt's host for good: its grading names, before either exists, what it leaves there (the
scoring container, and the state saved for that one scoring when the attempt's ended state is
not on the engine), and recovery removes both.

Before, a family asking no GPUs was scored in a container of Docker's own random name, which no
row named: a worker killed while it scored left that container running on (nothing kills it at
the time-out), and the state saved for it, a copy of the workspace's whole file system, on the
engine for good. One with GPUs named its SCORING workspace, whose destroy left that state.

SQLite-only and without Docker: the engine is the stand-in of the intermediate score's recovery
tests, which the dying process's own clean-up never reaches."""

from __future__ import annotations

from typing import Any

import pytest
from docker.errors import ImageNotFound

from baseline.context import Context
from baseline.grading import family_environment, grading_recovery, script_scoring
from baseline.models import (
    AttemptStatus,
    EgressPolicy,
    Grading,
    Host,
    JobStatus,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from infra.family_run import final_state_tag, is_scoring_run, scoring_state_tag
from tests.baseline.grading.test_family_intermediate_score_recovery import (
    LATER,
    WORKSPACE_CONTAINER,
    Engine,
    _die,
    _Killed,
)
from tests.baseline.tasks.family_world import family_attempt
from tests.baseline.tasks.test_task_family_scoring_gpus import _family_attempt, _final_grading

pytestmark = pytest.mark.sqlite_only("a final score's rows, on a stand-in engine")

CPU_STANDARD = {"family": "cpufam", "task": "main", "hooks": ["score"]}  # asks for no GPUs


class StatefulEngine(Engine):
    """The stand-in engine, whose images are looked up too: the attempt's ended state is there
    only when `final_state` (`family_launch.save_final_state` saved it)."""

    def __init__(self, *, final_state: bool) -> None:
        super().__init__()
        self.client.images.get.side_effect = self._get_image
        if final_state:
            self.images.add(final_state_tag(WORKSPACE_CONTAINER))

    def _get_image(self, tag: str) -> Any:
        self.reach()
        if tag not in self.images:
            raise ImageNotFound(f"no image {tag}")
        return type("Image", (), {"id": "sha256:state"})()


def _cpu_family_attempt(ctx: Context) -> int:
    """An ended attempt of a family asking no GPUs, on profile cpu (none), its workspace
    stopped on a host without GPUs."""
    with ctx.session() as session:
        host = Host(name="cpu-host", docker_url="unix:///var/run/docker.sock", healthy=True)
        attempt = family_attempt(
            session,
            host,
            family="cpufam",
            scoring={
                "script": "family/hook.py",
                "command": "python3 {script} score",
                "starting_score": 0.0,
                "reference_score": 1.0,
                "user": "root",
                "task_standard": CPU_STANDARD,
            },
            profile="cpu",
            egress=EgressPolicy.NONE,
            status=AttemptStatus.SUBMITTED,
            image_digest="sha256:" + "f" * 64,
        )
        session.add(
            Workspace(
                attempt_id=attempt.id,
                purpose=WorkspacePurpose.ATTEMPT,
                host_id=host.id,
                backend="docker",
                name=f"ws-a{attempt.id}-cpu",
                container_id=WORKSPACE_CONTAINER,
                submission_volume=f"ws-a{attempt.id}-cpu-submission",
                image="baseline-family:cpufam",
                image_digest="sha256:" + "f" * 64,
                hardware_profile="cpu",
                status=WorkspaceStatus.STOPPED,
            )
        )
        return attempt.id


def _killed_while_scoring(
    ctx: Context, grading_id: int, engine: StatefulEngine, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Run the grading and kill the worker while the hook runs (its own clean-up, the SCORING
    workspace's destroy included, never runs); the name its grading keeps."""
    engine.while_scoring = _die(engine)
    with monkeypatch.context() as dying:
        dying.setattr(family_environment, "destroy_or_leave", lambda *_args: None)
        with pytest.raises(_Killed):
            script_scoring.run_script_grading(ctx, grading_id, backend_factory=engine.factory())
    engine.dead = False
    grading = _grading(ctx, grading_id)
    assert grading.status is JobStatus.RUNNING
    name = grading.config.get("workspace")
    assert isinstance(name, str), "the grading names nothing the scoring left"
    assert engine.containers == {name}, "the scoring container is not named so"
    return name


def _grading(ctx: Context, grading_id: int) -> Grading:
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        assert grading is not None
        return grading


def _recover(ctx: Context, grading_id: int, engine: StatefulEngine) -> Grading:
    recovered = grading_recovery.recover_interrupted(
        ctx, backend_factory=engine.factory(), now=script_scoring.utcnow() + LATER
    )
    assert recovered == [grading_id]
    grading = _grading(ctx, grading_id)
    assert grading.status is JobStatus.QUEUED and grading.tries == 1
    assert "interrupted: its process stopped" in (grading.error or "")
    return grading


@pytest.mark.parametrize("final_state", [False, True], ids=["state-saved-now", "ended-state"])
def test_recovery_removes_what_a_killed_final_score_without_gpus_left(
    ctx: Context, monkeypatch: pytest.MonkeyPatch, final_state: bool
) -> None:
    """No GPUs, so no SCORING workspace: the grading names a scoring run before it stands.
    Recovery removes its container, and the state saved for it when the ended state was not on
    the engine; the ended state itself, the attempt workspace's, is left to that workspace."""
    grading_id = _final_grading(ctx, _cpu_family_attempt(ctx))
    engine = StatefulEngine(final_state=final_state)
    name = _killed_while_scoring(ctx, grading_id, engine, monkeypatch)
    assert is_scoring_run(name)
    ended = {final_state_tag(WORKSPACE_CONTAINER)} if final_state else set()
    assert engine.images == (ended or {scoring_state_tag(name)})

    _recover(ctx, grading_id, engine)
    assert (engine.containers, engine.images) == (set(), ended)


def test_a_killed_final_score_with_gpus_leaves_no_state_once_its_workspace_is_destroyed(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With GPUs, the grading names its SCORING workspace, after which the container and the
    state saved for it are named: recovery's destroy of that workspace removes both (the state
    stayed on the engine for good)."""
    attempt_id, _host_id = _family_attempt(ctx, live=False)
    grading_id = _final_grading(ctx, attempt_id)
    engine = StatefulEngine(final_state=False)
    name = _killed_while_scoring(ctx, grading_id, engine, monkeypatch)
    assert name.startswith(f"ws-{WorkspacePurpose.SCORING.value}-")
    assert engine.images == {scoring_state_tag(name)}

    _recover(ctx, grading_id, engine)
    assert (engine.containers, engine.images) == (set(), set())


def test_a_scoring_run_that_cannot_be_removed_now_keeps_its_grading_for_the_next_round(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's host does not answer when recovery runs: the grading is left running,
    naming its scoring run (queued, it would name the next run's, and nothing else retries the
    removal); the next round, the host back, removes the run and queues the grading again."""
    grading_id = _final_grading(ctx, _cpu_family_attempt(ctx))
    engine = StatefulEngine(final_state=False)
    name = _killed_while_scoring(ctx, grading_id, engine, monkeypatch)
    engine.down = True
    later = script_scoring.utcnow() + LATER
    assert (
        grading_recovery.recover_interrupted(ctx, backend_factory=engine.factory(), now=later) == []
    )
    grading = _grading(ctx, grading_id)
    assert grading.status is JobStatus.RUNNING and grading.config["workspace"] == name
    assert engine.containers == {name}

    engine.down = False
    _recover(ctx, grading_id, engine)
    assert (engine.containers, engine.images) == (set(), set())
