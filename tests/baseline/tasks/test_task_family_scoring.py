"""Task Standard families scored as Vivaria scores them: RE-Bench's intermediate_score +
aggregate_scores, and an answer string submitted through /home/agent/submission.txt.

The families are written here. ``bestloss`` mirrors RE-Bench's pattern: no ``score()``;
``start`` and ``intermediate_score`` read the family's ``/root/assets``; ``intermediate_score``
measures a loss (lower is better) and reports NaN with a message when there is no valid solution;
``aggregate_scores`` gives the final score as the best valid score of the attempt's log.
``say_hello`` mirrors Vivaria's hello_world: ``score(task, submission)`` compares the submitted
string with the answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.attempts import attempts, launch
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.grading import script_scoring
from baseline.models import AttemptStatus, JobStatus, ScoreLog, Task
from baseline.tasks import tasks
from infra.blobs import BlobStore
from tests.baseline.tasks.test_task_families import (
    _exec,
    _import,
    _study_with,
    factory,
    inspecting_engine,
    local_host,
)
from tests.docker_env import test_image

__all__ = ["inspecting_engine", "local_host", "test_image"]  # fixtures used by the tests below

BESTLOSS = """\
import math
from pathlib import Path

LOSS = Path("/home/agent/loss.txt")
ASSETS = Path("/root/assets")  # where the Task Standard puts the family


class TaskFamily:
    standard_version = "0.2.3"

    @staticmethod
    def get_tasks():
        return {"main": {"starting_score": 8.0, "reference_score": 2.0,
                         "score_direction": "lower"}}

    @staticmethod
    def get_instructions(t):
        return "Lower the loss written in /home/agent/loss.txt."

    @staticmethod
    def start(t):
        LOSS.write_text((ASSETS / "start_loss.txt").read_text())

    @staticmethod
    def intermediate_score(t):
        try:
            loss = float(LOSS.read_text())
        except (OSError, ValueError):
            return {"score": float("nan"), "message": {"error": "loss.txt holds no number"}}
        if loss > float((ASSETS / "ceiling.txt").read_text()):
            return {"score": float("nan"), "message": {"error": "above the ceiling"}}
        return {"score": loss, "message": {"loss": loss}}

    @staticmethod
    def aggregate_scores(t, score_log):
        valid = [e["score"] for e in score_log if not math.isnan(e["score"])]
        return min(valid) if valid else float("nan")
"""


def write_bestloss(root: Path) -> Path:
    folder = root / "bestloss"
    folder.mkdir(parents=True)
    (folder / "bestloss.py").write_text(BESTLOSS)
    (folder / "assets").mkdir()
    (folder / "assets" / "start_loss.txt").write_text("8\n")
    (folder / "assets" / "ceiling.txt").write_text("100\n")
    return folder


def test_family_with_intermediate_and_aggregate_scores_and_no_score_imports(
    ctx: Context, tmp_path: Path
) -> None:
    (task,) = _import(ctx, write_bestloss(tmp_path))
    with ctx.session() as session:
        stored = session.get(Task, task.id)
        assert stored is not None and stored.scoring is not None
        hooks = stored.scoring["task_standard"]["hooks"]
        assert {"intermediate_score", "aggregate_scores"} <= set(hooks) and "score" not in hooks


@pytest.mark.docker
@pytest.mark.sqlite_only("the family's scoring hooks")
def test_final_score_is_aggregate_scores_of_the_intermediate_scores(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    _, attempt_id = _study_with(ctx, write_bestloss(tmp_path))
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING

    def intermediate(loss: str) -> ScoreLog:
        _exec(ctx, attempt_id, f"echo '{loss}' > /home/agent/loss.txt")
        return script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)

    # start() read /root/assets in the workspace, intermediate_score() reads it in the scoring
    # container: the family is at /root in both, as the Task Standard puts it.
    assert _exec(ctx, attempt_id, "cat /home/agent/loss.txt") == b"8\n"
    above = intermediate("1000")
    assert above.floor_reason == "no_valid_solution"
    assert above.error is not None and "above the ceiling" in above.error
    best = intermediate("4")
    assert best.error is None and best.raw_score == 4.0
    assert best.normalised_score == pytest.approx(2 / 3)
    # NaN with a message: "no valid solution", at the floor, its message kept.
    invalid = intermediate("oops")
    assert invalid.floor_reason == "no_valid_solution"
    assert (invalid.raw_score, invalid.normalised_score) == (8.0, 0.0)
    assert invalid.error is not None and "loss.txt holds no number" in invalid.error

    _exec(ctx, attempt_id, "echo 6 > /home/agent/loss.txt")
    final = attempts.submit(ctx, attempt_id, None, resolve_source, backend_factory=factory)
    with ctx.session() as session:
        snapshot = script_scoring.snapshot_of(session, final.id)
        grading_id = script_scoring.create_script_grading(session, snapshot).id
    grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
    # aggregate_scores over [4, NaN, 6 (the submission's own intermediate score)]: the best, 4,
    # not the submission's 6 alone.
    assert grading.status is JobStatus.SUCCEEDED, grading.error
    assert grading.floor_reason is None
    assert grading.raw_score == 4.0 and grading.score == pytest.approx(2 / 3)
    with ctx.session() as session:
        logged = session.scalars(select(ScoreLog.raw_score).order_by(ScoreLog.id)).all()
    assert logged == [8.0, 4.0, 8.0]


SAY_HELLO = """\
class TaskFamily:
    standard_version = "0.3.0"

    @staticmethod
    def get_tasks():
        return {"main": {"answer": "hello world", "starting_score": 0, "reference_score": 1}}

    @staticmethod
    def get_instructions(t):
        return "Submit the string 'hello world'."

    @staticmethod
    def score(t, submission):
        return 1.0 if submission == t["answer"] else 0.0
"""


def write_say_hello(root: Path) -> Path:
    folder = root / "say_hello"
    folder.mkdir(parents=True)
    (folder / "say_hello.py").write_text(SAY_HELLO)
    return folder


def test_answer_family_instructions_say_where_the_answer_goes(ctx: Context, tmp_path: Path) -> None:
    (task,) = _import(ctx, write_say_hello(tmp_path))
    with ctx.session() as session:
        stored = session.get(Task, task.id)
        assert stored is not None
        text = tasks.read_task_file(BlobStore(ctx.settings.blob_dir), stored, "instructions.md")
    assert text.startswith(b"Submit the string 'hello world'.")
    assert b"write it to `/home/agent/submission.txt` before you submit" in text


@pytest.mark.sqlite_only("the family's scoring of an answer file")
@pytest.mark.docker
def test_answer_written_to_submission_txt_is_scored(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    _, attempt_id = _study_with(ctx, write_say_hello(tmp_path))
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    # As a participant does, with an editor's final newline.
    _exec(ctx, attempt_id, "echo 'hello world' > /home/agent/submission.txt")
    final = attempts.submit(ctx, attempt_id, None, resolve_source, backend_factory=factory)
    with ctx.session() as session:
        snapshot = script_scoring.snapshot_of(session, final.id)
        grading_id = script_scoring.create_script_grading(session, snapshot).id
    grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
    assert grading.status is JobStatus.SUCCEEDED, grading.error
    assert (grading.raw_score, grading.score) == (1.0, 1.0)
