"""Task Standard families scored in the task's own environment, as Vivaria scores them, and the
families Baseline refuses because nothing could score them.

``whereran`` mirrors RE-Bench's hooks: ``start`` reads ``/root/assets``, runs commands as
``agent`` and ``chown``s to it, protects a file as ``root:protected`` and leaves state outside
``/home/agent`` (``/opt``); scoring needs that state, the agent's files whatever their size and
mode, runs the agent's code as ``agent`` (``subprocess.run(user="agent")``, ``runuser -u agent``)
and ``chown``s to ``agent:agent``; ``teardown`` removes the state, which the final score (taken
before it, as Vivaria does) must not notice. Every check that fails is named in a NaN's message.
"""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from sqlalchemy import select

from baseline.attempts import attempts, launch
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.grading import script_scoring
from baseline.models import Attempt, AttemptStatus, JobStatus, ScoreLog, Workspace
from baseline.workspaces import workspaces
from infra.family_run import final_state_tag, scoring_state_tag
from tests.baseline.tasks.test_task_families import (
    _exec,
    _import,
    _study_with,
    factory,
    inspecting_engine,
    local_host,
)
from tests.docker_env import LOCAL_URL, test_image

__all__ = ["inspecting_engine", "local_host", "test_image"]  # fixtures used by the tests below

WHERERAN = """\
import math
import shutil
import subprocess
from pathlib import Path

STATE = Path("/opt/whereran/state.txt")  # start() leaves it outside /home/agent
KEY = Path("/root/assets/key.txt")


class TaskFamily:
    standard_version = "0.2.3"

    @staticmethod
    def get_tasks():
        return {"main": {"starting_score": 0, "reference_score": 1}}

    @staticmethod
    def get_instructions(t):
        return "Leave big.bin (11 MB) and a private note.txt in /home/agent."

    @staticmethod
    def start(t):
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(KEY.read_text())
        # As RE-Bench's start does: the agent's files made as agent or chowned to it, and a
        # file the agent may read but not change (root:protected).
        subprocess.check_call(["runuser", "-u", "agent", "--", "mkdir", "/home/agent/solution"])
        Path("/home/agent/solution/train.py").write_text("print('train')\\n")
        subprocess.check_call(["chown", "-R", "agent:agent", "/home/agent/solution"])
        shutil.copy(KEY, "/home/agent/rules.txt")  # the image has the group "protected"
        shutil.chown("/home/agent/rules.txt", "root", "protected")

    @staticmethod
    def teardown(t):
        STATE.unlink()

    @staticmethod
    def intermediate_score(t):
        problems = []
        if not STATE.is_file() or STATE.read_text() != KEY.read_text():
            problems.append("start's state is gone")
        big = Path("/home/agent/big.bin")
        if not big.is_file() or big.stat().st_size < 11 * 2**20:
            problems.append("big.bin is missing")
        try:
            Path("/home/agent/note.txt").read_text()
        except OSError as exc:
            problems.append(f"note.txt: {exc}")
        try:
            ran = subprocess.run(["id", "-un"], user="agent", capture_output=True, text=True)
            if ran.returncode != 0:
                problems.append(f"user=agent: {ran.stderr.strip()}")
        except (OSError, KeyError) as exc:
            problems.append(f"user=agent: {exc}")
        made = subprocess.run(
            ["runuser", "-u", "agent", "--", "touch", "/home/agent/by-agent"],
            capture_output=True, text=True,
        )
        if made.returncode != 0:
            problems.append(f"runuser: {made.stderr.strip()}")
        try:
            Path("/home/agent/scored").write_text("root wrote this")
            shutil.chown("/home/agent/scored", "agent", "agent")
        except (OSError, LookupError) as exc:
            problems.append(f"chown agent: {exc}")
        if problems:
            return {"score": math.nan, "message": {"problems": problems}}
        return {"score": 1.0, "message": {}}

    @staticmethod
    def score(t, submission):
        return TaskFamily.intermediate_score(t)
"""


def write_whereran(root: Path) -> Path:
    folder = root / "whereran"
    (folder / "assets").mkdir(parents=True)
    (folder / "whereran.py").write_text(WHERERAN)
    (folder / "assets" / "key.txt").write_text("only start() copies this\n")
    return folder


@pytest.mark.docker
@pytest.mark.sqlite_only("the family's containers and scores")
def test_family_is_scored_in_the_environment_the_task_ran_in(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    _, attempt_id = _study_with(ctx, write_whereran(tmp_path))
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        errors = session.scalars(select(Workspace.last_error)).all()
        assert status is AttemptStatus.RUNNING, (attempt.end_reason, errors)
    # start() ran with what it needs, in its own container; the workspace has what it made.
    owners = "cd /home/agent && stat -c '%n %U:%G' solution solution/train.py rules.txt"
    assert _exec(ctx, attempt_id, owners).decode().splitlines() == [
        "solution participant:participant",  # agent is the participant's uid and gid
        "solution/train.py participant:participant",
        "rules.txt root:protected",
    ]
    refused = "(echo x >> /home/agent/rules.txt) 2>/dev/null || echo refused"
    assert _exec(ctx, attempt_id, refused) == b"refused\n"
    # Over the snapshot's 10 MB file limit, and readable by its owner only.
    _exec(
        ctx,
        attempt_id,
        "head -c 11534336 /dev/zero > /home/agent/big.bin && echo mine > /home/agent/note.txt "
        "&& chmod 600 /home/agent/note.txt",
    )
    client = docker.DockerClient(base_url=LOCAL_URL)
    try:
        log = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)
        assert log.error is None, log.error
        assert (log.raw_score, log.normalised_score) == (1.0, 1.0)
        assert log.workspace is not None  # its scoring run, whose saved state is removed
        assert client.images.list(name=scoring_state_tag(log.workspace)) == []
        # What the scoring did stayed in its own container: the workspace is as the agent left it.
        listed = _exec(ctx, attempt_id, "ls /home/agent").split()
        assert listed == [b"big.bin", b"note.txt", b"rules.txt", b"solution"]

        final = attempts.submit(ctx, attempt_id, None, resolve_source, backend_factory=factory)
        # The family's teardown ran at the end: the state is gone from the (stopped) workspace ...
        with ctx.session() as session:
            query = select(Workspace).where(Workspace.attempt_id == attempt_id)
            container_id = session.scalars(query).one().container_id
        assert container_id is not None
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(container_id).get_archive("/opt/whereran/state.txt")
        with ctx.session() as session:
            snapshot = script_scoring.snapshot_of(session, final.id)
            grading_id = script_scoring.create_script_grading(session, snapshot).id
        grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
        # ... but the final score was taken in the environment as it was before the teardown.
        assert grading.status is JobStatus.SUCCEEDED, grading.error
        assert grading.floor_reason is None, grading.error
        assert (grading.raw_score, grading.score) == (1.0, 1.0)
        assert grading.config["scored_in"] == "task environment"
        # The saved state goes with the workspace's container. (This attempt's own state only:
        # another test's, running beside this one, may be in the repository meanwhile.)
        saved = final_state_tag(container_id)
        assert client.images.list(name=saved) != []
        with ctx.session() as session:
            for workspace in workspaces.live_workspaces(session):
                workspaces.destroy(session, workspace, factory)
        assert client.images.list(name=saved) == []
    finally:
        client.close()


NO_SCORE = """\
class TaskFamily:
    standard_version = "0.3.0"

    @staticmethod
    def get_tasks():
        return {"main": {}}

    @staticmethod
    def get_instructions(t):
        return "Make inference faster; a person judges the result."

    @staticmethod
    def intermediate_score(t):
        return None
"""


@pytest.mark.sqlite_only("the import's refusal")
def test_family_scored_by_hand_in_vivaria_is_refused_saying_why(
    ctx: Context, tmp_path: Path
) -> None:
    """Vivaria has a person score a family without score() (gpu_inference); Baseline has no hand
    scoring of family tasks, so importing one is refused, naming that, and nothing is stored."""
    folder = tmp_path / "by_hand"
    folder.mkdir()
    (folder / "by_hand.py").write_text(NO_SCORE)
    with pytest.raises(InvalidInput, match="Vivaria has a person score such a family by hand"):
        _import(ctx, folder)


PROTSCORE = """\
from pathlib import Path

import metr.task_protected_scoring as scoring


class TaskFamily:
    standard_version = "0.2.3"

    @staticmethod
    def get_tasks():
        return {"main": {"starting_score": 8.0, "reference_score": 2.0,
                         "score_direction": "lower"}}

    @staticmethod
    def get_instructions(t):
        return "Lower the loss in /home/agent/loss.txt. " + scoring.SCORING_INSTRUCTIONS

    @staticmethod
    def start(t):
        scoring.setup_scoring()
        Path("/protected/ceiling.txt").write_text("100\\n")
        scoring.protect_path("/protected/ceiling.txt", read_other=False)
        Path("/home/agent/loss.txt").write_text("8\\n")

    @staticmethod
    def intermediate_score(t):
        return scoring.intermediate_score(catch_out_of_memory=True)

    @staticmethod
    def aggregate_scores(t, score_log):
        return scoring.get_best_score(score_log=score_log, select_best_fn=min)
"""

SCORE_PY = """\
import math
from pathlib import Path

import metr.task_protected_scoring as scoring

try:
    loss = float(Path("/home/agent/loss.txt").read_text())
except ValueError:
    loss = math.nan
print("loss", loss)
try:
    scoring.check_scoring_group()
except AssertionError:
    raise SystemExit(0)  # run by the agent itself: nothing is logged
if loss > float(Path("/protected/ceiling.txt").read_text()):
    scoring.log_score(score=math.nan, message={"error": "above the hidden ceiling"})
else:
    scoring.log_score(score=loss, message={"loss": loss})
"""


@pytest.mark.docker
@pytest.mark.sqlite_only("the family's containers and scores")
def test_family_with_task_protected_scoring_runs_and_scores(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    """RE-Bench's pattern: metr.task_protected_scoring sets up score.py (the agent may read and
    run it, not change it) and a hidden file; intermediate_score runs score.py as agent with the
    protected group, which alone reads the hidden file and writes the log; the final score is
    the best of the attempt's scores."""
    folder = tmp_path / "protscore"
    (folder / "assets").mkdir(parents=True)
    (folder / "protscore.py").write_text(PROTSCORE)
    (folder / "assets" / "score.py").write_text(SCORE_PY)
    _, attempt_id = _study_with(ctx, folder)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    checks = (
        "cd /home/agent; stat -c '%U:%G %a' score.py; python3 score.py; "
        "for p in /home/agent/score.py /protected/ceiling.txt /protected/score.log; do "
        '(echo x >> "$p") 2>/dev/null && echo "WROTE $p"; '
        'cat "$p" >/dev/null 2>&1 && echo "READ $p"; done; true'
    )
    assert _exec(ctx, attempt_id, checks).decode().splitlines() == [
        "root:protected 444",
        "loss 8.0",
        "READ /home/agent/score.py",
    ]

    def intermediate(loss: str) -> ScoreLog:
        _exec(ctx, attempt_id, f"echo {loss} > /home/agent/loss.txt")
        return script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)

    best = intermediate("4")
    assert best.error is None and best.raw_score == 4.0
    above = intermediate("1000")
    assert above.floor_reason == "no_valid_solution"
    assert above.error is not None and "above the hidden ceiling" in above.error
    _exec(ctx, attempt_id, "echo 6 > /home/agent/loss.txt")
    final = attempts.submit(ctx, attempt_id, None, resolve_source, backend_factory=factory)
    with ctx.session() as session:
        snapshot = script_scoring.snapshot_of(session, final.id)
        grading_id = script_scoring.create_script_grading(session, snapshot).id
    grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
    assert grading.status is JobStatus.SUCCEEDED, grading.error
    assert grading.raw_score == 4.0  # min over 4, NaN and the submission's own 6
