"""A question naming files its repository lacks (issue 38, item 1's leftover): EXP-Bench marks it
invalid and skips it, the paper's other questions running (as paper 94391 of its release, whose
repository lacks question 0's ``run_comparison.sh``); Baseline does the same by default, reporting
each skipped question with its reason, and ``refuse`` refuses the whole paper instead."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from baseline.cli import main
from baseline.context import Context
from baseline.models import Task
from baseline.tasks import expbench, tasks
from infra.blobs import BlobStore
from tests.baseline import expbench_world as world


def _questions(masked_0: list[str], source_0: list[str] | None = None) -> dict[str, Any]:
    """The world's three questions as the release writes them, question 0 masking `masked_0`
    (and naming `source_0` as its source when given)."""
    found = copy.deepcopy(world.release_questions())
    found[0]["masked_source"] = masked_0
    if source_0 is not None:
        found[0]["source"] = source_0
    return {"questions": found}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_question_whose_masked_files_are_missing_is_skipped(ctx: Context, tmp_path: Path) -> None:
    folder = world.build_release(tmp_path, _questions(["/workspace/run_comparison.sh"]))
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        results = tasks.import_tasks(session, blobs, [folder])
        assert [r.task.slug for r in results] == [
            f"expbench-{world.PAPER_ID}-q1",
            f"expbench-{world.PAPER_ID}-q2",
        ]
        (note,) = results[0].warnings
        assert "$.questions[0] skipped, as EXP-Bench skips" in note
        assert (
            "$.questions[0].masked_source[0]: '/workspace/run_comparison.sh' "
            "('run_comparison.sh' in the repository) is not a file of" in note
        )
        assert results[1].warnings == []
    with ctx.session() as session, pytest.raises(expbench.PaperRefused) as refused:
        tasks.import_tasks(
            session, blobs, [folder], expbench_missing_files=expbench.MissingFiles.REFUSE
        )
    (error,) = refused.value.errors
    assert "$.questions[0].masked_source[0]: '/workspace/run_comparison.sh'" in error


def test_only_the_files_exp_bench_masks_are_looked_for(ctx: Context, tmp_path: Path) -> None:
    """EXP-Bench masks ``masked_source`` when a question has it and never reads its ``source``:
    a listed source file the repository lacks skips nothing, unless the paper must be whole."""
    document = _questions(["/workspace/model.py"], ["/workspace/model.py", "/workspace/gone.py"])
    folder = world.build_release(tmp_path, document)
    plans, _, skipped = expbench.plan_expbench(folder)
    assert [p.question.index for p in plans] == [0, 1, 2] and skipped == []
    with pytest.raises(expbench.PaperRefused, match=r"\.source\[1\]: '/workspace/gone\.py'"):
        expbench.plan_expbench(folder, expbench.MissingFiles.REFUSE)


def test_a_paper_with_no_question_left_is_refused(tmp_path: Path) -> None:
    document = {"questions": [_questions(["/workspace/gone.py"])["questions"][0]]}
    folder = world.build_release(tmp_path, document)
    with pytest.raises(expbench.PaperRefused) as refused:
        expbench.plan_expbench(folder)
    first, last = refused.value.errors
    assert "$.questions[0] skipped" in first and "'/workspace/gone.py'" in first
    assert last.endswith("no question is left to import")


def test_cli_reports_each_skipped_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    release = tmp_path / "exp_bench"
    world.build_release(release, _questions(["/workspace/run_comparison.sh"]))
    code, out, _ = _run(capsys, "task", "check-expbench", str(release))
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == (
        f"imports  outputs/logs/neurips2024/{world.PAPER_ID}: 2 questions "
        "(1 no_code, 1 source), 1 skipped"
    )
    assert "$.questions[0] skipped" in lines[1] and "run_comparison.sh" in lines[1]
    assert lines[-1] == "1 paper: 1 import (2 questions, 1 skipped), 0 refused"
    code, out, _ = _run(capsys, "task", "check-expbench", str(release), "--json")
    (paper,) = json.loads(out)["papers"]
    assert paper["imports"] and len(paper["skipped_questions"]) == 1
    code, out, _ = _run(capsys, "task", "check-expbench", str(release), "--missing-files", "refuse")
    assert (
        code == 1
        and out.splitlines()[-1] == "1 paper: 0 import (0 questions, 0 skipped), 1 refused"
    )

    monkeypatch.setenv("BASELINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BASELINE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    code, _, err = _run(capsys, "init", "--admin-password", "a-long-password")
    assert code == 0, err
    folder = release / "outputs" / "logs" / "neurips2024" / world.PAPER_ID
    code, _, err = _run(capsys, "task", "import", str(folder), "--expbench-missing-files", "refuse")
    assert code == 1 and "run_comparison.sh" in err and "Traceback" not in err
    code, out, err = _run(capsys, "task", "import", str(folder))
    assert code == 0, err
    assert "warning: " in out and "$.questions[0] skipped" in out
    assert out.splitlines()[-1] == "2 tasks: 2 imported, 0 unchanged"
    with Context.from_settings().session() as session:
        assert session.query(Task).count() == 2


def test_a_paper_of_no_code_questions_needs_its_repository_too(tmp_path: Path) -> None:
    """EXP-Bench clones the paper's repository for every question (paper 19209 of its release
    has only no-code questions): without the clone its participants would start from nothing."""
    document = {"questions": [world.release_questions()[2]]}
    folder = world.build_release(tmp_path, document)
    assert [p.question.index for p in expbench.plan_expbench(folder)[0]] == [0]
    shutil.rmtree(folder / "repo")
    with pytest.raises(expbench.PaperRefused) as refused:
        expbench.plan_expbench(folder)
    (error,) = refused.value.errors
    assert "repo is missing or empty" in error and world.RELEASE_CODE_URL in error
