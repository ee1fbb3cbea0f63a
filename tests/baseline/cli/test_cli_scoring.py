"""`baseline reproduce / score / rescore / grading`: one-line errors and the export of a grading."""

from __future__ import annotations

import json
from pathlib import Path

from baseline.config import Settings
from baseline.context import Context
from baseline.models import Grading, GradingKind, JobStatus, LeafGrade, Snapshot
from tests.baseline.cli.test_cli_core import run
from tests.baseline.cli.test_cli_infra import run as run_in_process
from tests.scoring.scoring_world import build_world, snapshot_reference


def test_errors_are_one_line(tmp_path: Path) -> None:
    assert run(["db", "upgrade"], tmp_path).returncode == 0
    cases = {
        ("reproduce", "999"): "error: no snapshot 999",
        ("grading", "export", "7", "--out", str(tmp_path / "x.json")): "error: no grading 7",
        ("grading", "progress", "5"): "error: no attempt 5",
        (
            "rescore", "1", "--base-url", "http://127.0.0.1:9/v1", "--model", "unlisted-model",
        ): "error: no price known for model 'unlisted-model'",
        (
            "rescore", "1", "--base-url", "http://127.0.0.1:9/v1", "--model", "gpt-4o",
        ): "error: no study named or numbered '1'",
    }  # fmt: skip
    for args, message in cases.items():  # in-process: a subprocess each cost seconds of imports
        result = run_in_process(list(args), tmp_path)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(message), (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_export_and_progress(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(["db", "upgrade"], home).returncode == 0
    settings = Settings(home=home, database_url=f"sqlite:///{home / 'baseline.db'}", secret_key="k")
    ctx = Context.from_settings(settings)
    world = build_world(ctx)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "sub")
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        grading = Grading(
            snapshot_id=snapshot_id,
            kind=GradingKind.EXPERT,
            status=JobStatus.RUNNING,
            leaves_graded=1,
            leaves_total=25,
        )
        session.add(grading)
        session.flush()
        session.add(
            LeafGrade(grading_id=grading.id, leaf_path="0.0", leaf_id="x", score=1.0, valid=True)
        )
        grading_id = grading.id
        session.add_all(
            [
                Grading(
                    snapshot_id=snapshot_id, kind=GradingKind.SCRIPT, status=JobStatus.SUCCEEDED,
                    score=0.0, floor_reason="no_score",
                ),
                Grading(
                    snapshot_id=snapshot_id, kind=GradingKind.SCRIPT, status=JobStatus.FAILED,
                    error="the scoring workspace broke\nTraceback (most recent call last): ...",
                ),
            ]
        )  # fmt: skip
    ctx.engine.dispose()
    out = tmp_path / "tree.json"
    result = run(["grading", "export", str(grading_id), "--out", str(out)], home)
    assert result.returncode == 0, result.stderr
    tree = json.loads(out.read_text())
    assert tree["id"] == "digits-root" and tree["sub_tasks"][0]["sub_tasks"][0]["score"] == 1
    progress = run(["grading", "progress", str(world.attempt_id)], home)
    assert progress.returncode == 0, progress.stderr
    # As the portal's page: leaves where there are any, the floor and why, a failure's error.
    assert (
        f"snapshot {snapshot_id}: not reproduced; expert running 1/25 leaves; "
        "script succeeded score 0.000 (at the floor: no_score); "
        "script failed (the scoring workspace broke)\n"
    ) in progress.stdout
    # A paper task in a study without a judge: said, not left at "no grading" (issue 36 item 8).
    assert "has no judge: the snapshots of the paper task" in progress.stderr
