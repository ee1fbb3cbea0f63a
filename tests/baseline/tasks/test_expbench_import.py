"""EXP-Bench import: one task per question (all three kinds), hidden ground truth, JSON-path
errors (every one), EXP-Bench's release read as it is and checked whole, and a submission
repository whose files and history hold no masked content and whose reproduce.sh runs
EXP-Bench's script."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.scaffold import BasicScaffold, IterativeScaffold, TaskBrief, TimeStatus
from baseline.cli import main
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.models import FileVisibility, Task, TaskKind
from baseline.tasks import expbench, tasks
from infra.blobs import BlobStore
from infra.local_backend import LocalSandboxBackend
from infra.workspace import SUBMISSION_DIR, WorkspaceSpec
from tests.baseline import expbench_world as world
from tests.infra.test_local_backend import PROFILE, sandbox_backend


def test_import_one_task_of_each_kind(ctx: Context, tmp_path: Path) -> None:
    folder = world.build(tmp_path)
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        results = tasks.import_tasks(session, blobs, [folder])
        assert [r.task.slug for r in results] == [
            f"expbench-{world.PAPER_ID}-q0",
            f"expbench-{world.PAPER_ID}-q1",
            f"expbench-{world.PAPER_ID}-q2",
        ]
        assert all(r.created and r.task.kind is TaskKind.EXPBENCH for r in results)
        kinds = [r.task.summary["expbench_kind"] for r in results]
        assert kinds == ["masked", "source", "no_code"]
        masked = results[0].task
        files = {f.path: f.visibility for f in masked.files}
        assert files["instructions.md"] is FileVisibility.PARTICIPANT
        assert files["repo/train.py"] is FileVisibility.PARTICIPANT
        assert files["expbench.json"] is FileVisibility.HIDDEN
        assert files["original/model.py"] is FileVisibility.HIDDEN
        assert "repo/model.py" not in files
        assert "repo/README.md" not in files  # EXP-Bench's mask_repo deletes it
        assert not any(".git" in p.split("/") for p in files)  # the clone's history stays out
        truth = json.loads(tasks.read_task_file(blobs, masked, "expbench.json"))
        assert truth["question"]["expected_outcome"].startswith("Label smoothing improves")
        assert truth["paper"]["code_url"] == "https://github.com/example/smoothing"
        head = subprocess.run(
            ["git", "-C", str(folder / "repo"), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert truth["paper"]["repo_commit"] == head == masked.summary["repo_commit"]
        text = tasks.read_task_file(blobs, masked, "instructions.md").decode()
        assert "Does label smoothing improve" in text and "Train with and without" in text
        assert "expected_outcome" not in text and "about 1 point" not in text
        shown = tmp_path / "shown"
        tasks.materialize_task_files(session, blobs, masked, shown)
        every = "".join(p.read_text() for p in shown.rglob("*") if p.is_file())
        assert world.MASKED_MARKER not in every
        assert "about 1 point" not in every and "SmoothedLoss in model.py" not in every
    with ctx.session() as session:
        again = tasks.import_tasks(session, blobs, [folder])
        assert not any(r.created for r in again)
        assert session.query(Task).count() == 3


def _mutated(change: Any) -> dict[str, Any]:
    document = {"questions": copy.deepcopy(world.questions())}
    change(document)
    return document


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"paper": 1}, r"\$\.questions: expected a list"),
        (
            _mutated(lambda d: d["questions"][1].pop("expected_outcome")),
            r"\$\.questions\[1\]\.expected_outcome: expected a non-empty string",
        ),
        (
            _mutated(lambda d: d["questions"][0].update(masked_source=[3])),
            r"\$\.questions\[0\]\.masked_source\[0\]: expected a string",
        ),
        (
            _mutated(lambda d: d["questions"][0].update(masked_source=["../etc/passwd"])),
            r"\$\.questions\[0\]\.masked_source\[0\]: not a path inside the repository",
        ),
        (
            _mutated(
                lambda d: d["questions"][0]["design_complexity"].update(dependent_variables=5)
            ),
            r"\$\.questions\[0\]\.design_complexity\.dependent_variables: expected a list",
        ),
    ],
)
def test_malformed_files_name_the_json_path(
    ctx: Context, tmp_path: Path, document: Any, message: str
) -> None:
    folder = world.build(tmp_path, document)
    with ctx.session() as session, pytest.raises(InvalidInput, match=message):
        tasks.import_tasks(session, BlobStore(ctx.settings.blob_dir), [folder])
    with ctx.session() as session:
        assert session.query(Task).count() == 0


def test_malformed_json_and_metadata(ctx: Context, tmp_path: Path) -> None:
    folder = world.build(tmp_path)
    blobs = BlobStore(ctx.settings.blob_dir)
    (folder / "neurips2024.jsonl").write_text(json.dumps({"id": "other"}) + "\n")
    with ctx.session() as session, pytest.raises(InvalidInput, match="no line with id '93022'"):
        tasks.import_tasks(session, blobs, [folder])
    (folder / f"{world.PAPER_ID}_complete_final.json").write_text("{not json")
    with ctx.session() as session, pytest.raises(InvalidInput, match="not valid JSON"):
        tasks.import_tasks(session, blobs, [folder])


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalSandboxBackend]:
    yield from sandbox_backend(tmp_path / "local")


def test_submission_repository_holds_no_masked_content(
    ctx: Context, tmp_path: Path, backend: LocalSandboxBackend
) -> None:
    """The workspace's /home/submission: the masked tree, committed in a fresh history."""
    folder = world.build(tmp_path)
    blobs = BlobStore(ctx.settings.blob_dir)
    task_dir = tmp_path / "task-files"
    with ctx.session() as session:
        task = tasks.import_tasks(session, blobs, [folder])[0].task
        tasks.materialize_task_files(session, blobs, task, task_dir)
    handle = backend.create(
        WorkspaceSpec(
            name=f"ws-{uuid.uuid4().hex[:8]}", image="host", profile=PROFILE, task_dir=task_dir
        )
    )
    backend.start(handle)
    seeded = backend.exec(handle, ["bash", "-c", expbench.seed_script(SUBMISSION_DIR)])
    assert seeded.exit_code == 0, seeded.output.decode()
    again = backend.exec(handle, ["bash", "-c", expbench.seed_script(SUBMISSION_DIR)])
    assert again.exit_code == 0  # a restart leaves the participant's repository alone
    listing = backend.exec(
        handle,
        ["sh", "-c", "ls -A; git rev-list --all | wc -l; git log --all -p; git fsck --lost-found"],
        workdir=SUBMISSION_DIR,
    )
    out = listing.output.decode()
    assert listing.exit_code == 0, out
    names = set(out.split())
    assert {"train.py", "eval.py", "data", "reproduce.sh", ".git"} <= names
    assert "model.py" not in names and "README.md" not in names
    assert world.MASKED_MARKER not in out and world.README_MARKER not in out
    # Every object of the repository, reachable or not: none holds the masked file.
    submission = backend.root / "submissions" / handle.submission_volume
    objects = subprocess.run(
        ["git", "-C", str(submission), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    assert world.MASKED_MARKER.encode() not in objects
    assert b"print('train')" in objects  # the check can see file contents at all


def test_cli_imports_expbench_folder_with_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BASELINE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    code, _, err = _run(capsys, "init", "--admin-password", "a-long-password")
    assert code == 0, err
    folder = world.build(tmp_path / "good")
    code, out, err = _run(capsys, "task", "import", str(folder), "--json")
    assert code == 0, err
    rows = json.loads(out)["tasks"]
    assert [r["kind"] for r in rows] == ["expbench"] * 3 and all(r["created"] for r in rows)
    code, out, _ = _run(capsys, "task", "import", str(folder))
    assert code == 0 and "0 imported, 3 unchanged" in out
    bad = world.build(tmp_path / "bad", {"questions": [{"question": "q?"}]})
    code, _, err = _run(capsys, "task", "import", str(bad))
    assert code == 1 and "$.questions[0].expected_outcome" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_sets_the_all_passed_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BASELINE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    assert _run(capsys, "init", "--admin-password", "a-long-password")[0] == 0
    code, out, err = _run(capsys, "study", "create", "Pilot")
    assert code == 0, err
    code, _, err = _run(capsys, "grading", "expbench-policy", "1", "--stages", "design,bogus")
    assert code == 2 and "bogus" in err and "Traceback" not in err
    code, out, err = _run(
        capsys,
        "grading",
        "expbench-policy",
        "1",
        "--stages",
        "design,conclusion",
        "--threshold",
        "0.5",
    )
    assert code == 0, err
    assert "monitor clean and design >= 0.5 and conclusion >= 0.5" in out
    code, _, err = _run(capsys, "grading", "expbench-policy", "99")
    assert code == 1 and "no study named or numbered '99'" in err
    code, out, err = _run(capsys, "grading", "expbench-policy", "Pilot")  # named, as elsewhere
    assert code == 0 and out.startswith("study 1: all stages passed"), err
    # EXP-Bench's hour by default; another limit is a named setting (issue 38, item 9).
    assert "execution within 60 min" in out
    code, out, err = _run(
        capsys, "grading", "expbench-policy", "1", "--execution-limit-minutes", "90"
    )
    assert code == 0 and "execution within 90 min" in out, err
    code, _, err = _run(capsys, "grading", "expbench-policy", "1", "--execution-limit-minutes", "0")
    assert code == 1 and "must be above 0" in err and "Traceback" not in err
    # The study's judge is set without re-grading anything (issue 38, item 10).
    code, out, err = _run(
        capsys,
        "grading",
        "set-judge",
        "1",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "o3-mini",
    )
    assert code == 0 and out.startswith("study 1: judge o3-mini ("), err


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("layout", ["release", "paper folder"])
def test_release_imports_unchanged(ctx: Context, tmp_path: Path, layout: str) -> None:
    """EXP-Bench's release as it is (issue 38, item 1): paths lose the ``/workspace/`` and
    ``/tmp/`` prefixes EXP-Bench strips itself, an object ``method`` is kept as its text, the
    conference's JSON-lines ``*_withcode_popularity_stars-100.json`` is found (beside the tasks in
    the release's ``logs/<conference>/``, or copied into the paper folder) and an empty
    ``code_url`` falls back to ``reproduce_eval.code``."""
    folder = world.build_release(tmp_path)
    if layout == "paper folder":
        moved = tmp_path / "logs" / "neurips2024" / world.RELEASE_METADATA
        moved.rename(folder / world.RELEASE_METADATA)
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        results = tasks.import_tasks(session, blobs, [folder])
        kinds = [r.task.summary["expbench_kind"] for r in results]
        assert kinds == ["masked", "source", "no_code"]
        masked = results[0].task
        files = {f.path for f in masked.files}
        assert "original/model.py" in files and "repo/model.py" not in files
        assert "repo/train.py" in files and "repo/eval.py" in files
        truth = json.loads(tasks.read_task_file(blobs, masked, "expbench.json"))
        assert truth["paper"]["code_url"] == world.RELEASE_CODE_URL
        assert truth["paper"]["title"] == "Label Smoothing Revisited"
        assert truth["question"]["masked_source"] == ["/workspace/model.py"]  # kept as written
        text = tasks.read_task_file(blobs, results[2].task, "instructions.md").decode()
        assert "Count the labels of each class" in text and "evaluation_strategy" in text
        assert results[0].skipped == [f"{world.PAPER_ID}.json"]


def test_every_error_is_reported_and_nothing_imports(ctx: Context, tmp_path: Path) -> None:
    """All or nothing still, but the refusal lists every error with its JSON path, not only the
    first (issue 38, item 1)."""

    def change(document: dict[str, Any]) -> None:
        document["questions"][0]["masked_source"] = ["/workspace/missing.py"]
        document["questions"][1].pop("expected_outcome")
        document["questions"][1]["source"] = [3]
        document["questions"][2]["design_complexity"]["dependent_variables"] = 5

    folder = world.build(tmp_path, _mutated(change))
    (folder / "neurips2024.jsonl").write_text(
        json.dumps({"id": world.PAPER_ID, "title": 7, "code_url": ["x"]}) + "\n"
    )
    with ctx.session() as session, pytest.raises(expbench.PaperRefused) as refused:
        tasks.import_tasks(
            session,
            BlobStore(ctx.settings.blob_dir),
            [folder],
            expbench_missing_files=expbench.MissingFiles.REFUSE,
        )
    expected = [
        r"\$\.questions\[1\]\.expected_outcome: expected a non-empty string",
        r"\$\.questions\[1\]\.source\[0\]: expected a string, got int",
        r"\$\.questions\[2\]\.design_complexity\.dependent_variables: expected a list",
        r"neurips2024\.jsonl:1: \$\.code_url: expected a string, got list",
        r"neurips2024\.jsonl:1: \$\.title: expected a string, got int",
        r"\$\.questions\[0\]\.masked_source\[0\]: '/workspace/missing\.py' \('missing\.py' in the "
        r"repository\) is not a file of",
    ]
    errors = refused.value.errors
    assert len(errors) == len(expected)
    for error, pattern in zip(errors, expected, strict=True):
        assert re.search(pattern, error), (pattern, error)
    message = str(refused.value)
    assert "\n" not in message and "refused (6 errors)" in message
    assert all(re.search(pattern, message) for pattern in expected)
    with ctx.session() as session:
        assert session.query(Task).count() == 0


def test_cli_checks_a_release_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``baseline task check-expbench`` reads a whole release as the import would and prints, per
    paper, that it imports or every error that refuses it (issue 38, item 1)."""
    release = tmp_path / "exp_bench"
    world.build_release(release)
    broken = {
        "questions": [
            {"question": "q?"},
            {"question": "r?", "expected_outcome": "e", "masked_source": ["/workspace/gone.py"]},
        ]
    }
    world.build_release(release, broken, conference="iclr2024")
    variant = release / "outputs" / "logs" / "iclr2024" / "18277"
    variant.mkdir()
    (variant / "18277_complete_final_sonnet37.json").write_text(json.dumps({"questions": []}))
    code, out, _ = _run(capsys, "task", "check-expbench", str(release), "--missing-files", "refuse")
    assert code == 1
    lines = out.splitlines()
    assert f"imports  outputs/logs/neurips2024/{world.PAPER_ID}: 3 questions " in out
    assert "(1 masked, 1 no_code, 1 source), 0 skipped" in out
    assert "refused  outputs/logs/iclr2024/18277: 1 error(s)" in lines
    assert f"refused  outputs/logs/iclr2024/{world.PAPER_ID}: 2 error(s)" in lines
    assert any("$.questions[0].expected_outcome: expected a non-empty string" in x for x in lines)
    assert any(
        "'/workspace/gone.py' ('gone.py' in the repository) is not a file" in x for x in lines
    )
    assert any("expected one *_complete_final.json, found 0" in x for x in lines)
    assert lines[-1] == "3 papers: 1 import (3 questions, 0 skipped), 2 refused"
    code, out, _ = _run(
        capsys, "task", "check-expbench", str(release), "--json", "--missing-files", "refuse"
    )
    papers = json.loads(out)["papers"]
    assert code == 1 and [p["imports"] for p in papers] == [False, False, True]
    assert papers[2]["kinds"] == {"masked": 1, "source": 1, "no_code": 1}
    assert len(papers[1]["errors"]) == 2
    good = release / "outputs" / "logs" / "neurips2024"
    code, out, _ = _run(capsys, "task", "check-expbench", str(good))
    assert code == 0
    assert out.splitlines()[-1] == "1 paper: 1 import (3 questions, 0 skipped), 0 refused"


def test_the_wrapper_runs_exp_benchs_script_and_the_agent_leaves_it(
    ctx: Context, tmp_path: Path
) -> None:
    """reproduce.sh starts as the wrapper (a repository's own top-level reproduce.sh included),
    exits with reproduce_exp_bench.sh's status, and the built-in agent is told to leave it,
    not to write it (issue 38, item 3)."""
    task_dir = tmp_path / "task"
    (task_dir / "repo").mkdir(parents=True)
    (task_dir / "repo" / "reproduce.sh").write_text("echo the paper's own\n")
    (task_dir / "repo" / "run.py").write_text("print(1)\n")
    submission = tmp_path / "submission"
    submission.mkdir()
    seeded = subprocess.run(
        ["bash", "-c", expbench.seed_script(str(submission), str(task_dir))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    assert (submission / "reproduce.sh").read_text() == expbench.REPRODUCE_WRAPPER
    (submission / "reproduce_exp_bench.sh").write_text("exit 3\n")
    ran = subprocess.run(["bash", "reproduce.sh"], cwd=submission, check=False)
    assert ran.returncode == 3

    folder = world.build(tmp_path / "paper")
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        task = tasks.import_tasks(session, blobs, [folder])[0].task
        text = tasks.read_task_file(blobs, task, "instructions.md").decode()
    assert "Leave `reproduce.sh` as it is" in text
    brief = TaskBrief(title=task.title, instructions=text, files=("/home/paper/instructions.md",))
    for scaffold in (BasicScaffold(), IterativeScaffold()):
        prompt = scaffold.system_prompt(brief, 3600)
        # Issue 38, item 6: it said "commit your work regularly" (EXP-Bench forbids git) and
        # named reproduce.sh; the instructions name the script and forbid git.
        assert "reproduce.sh" not in prompt and "commit" not in prompt
        assert "forbid git operations" in prompt
        # Nor any later message: the reminders and the nudge to go on asked for commits.
        later = scaffold.reminder(brief, TimeStatus(1800, 3600)), scaffold.continue_message(brief)
        assert not any("commit" in text for text in later), later
        assert "0.50 h left" in later[0] and "/home/submission" in later[0]
    other = TaskBrief(title="t", instructions="Reproduce the paper.", files=())
    assert "A reproduce.sh at the top of /home/submission must reproduce your results" in (
        BasicScaffold().system_prompt(other, 3600)
    )
    # PaperBench's agents are reminded to commit, as PaperBench's own scaffolds do.
    for scaffold in (BasicScaffold(), IterativeScaffold()):
        assert "commit your work" in scaffold.reminder(other, TimeStatus(1800, 3600))
    assert "committed" in IterativeScaffold().continue_message(other)


def test_participants_see_what_exp_benchs_agent_sees(ctx: Context, tmp_path: Path) -> None:
    """Participants saw more than EXP-Bench's agent (issue 38, item 6): the usage instructions
    naming the masked files, the paper's title, and a source-only question's files; EXP-Bench's
    rules were missing. Now: question, method, agent instructions and the rules; a question with
    only ``source`` has those files removed, as EXP-Bench's mask_repo removes them."""
    document = {"questions": world.release_questions()}
    document["questions"][0]["usage_instructions"] = "Edit /workspace/model.py: USAGE_MARKER"
    folder = world.build(tmp_path, document)
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        results = tasks.import_tasks(session, blobs, [folder])
        masked, source, no_code = (r.task for r in results)
        shown = {
            t.slug: tasks.read_task_file(blobs, t, "instructions.md").decode()
            for t in (masked, source, no_code)
        }
        titles = [t.title for t in (masked, source, no_code)]
        source_files = {f.path: f.visibility for f in source.files}
        no_code_files = {f.path for f in no_code.files}
    text = shown[masked.slug]
    assert "USAGE_MARKER" not in text and "Usage" not in text
    assert "Label Smoothing Revisited" not in text + " ".join(titles)
    assert not any(world.PAPER_ID in t for t in titles)  # nor the id to look it up by
    assert "Implement the loss, then run both configurations." in text  # agent instructions
    for rule in ("Do not read the paper", "Do not perform git operations", "README"):
        assert rule in text
    assert "/workspace/ in the task mean /home/submission/" in text
    assert "Agent instructions: (none)" in shown[source.slug]
    # The source-only question: eval.py removed, kept hidden as the judge's reference.
    assert "repo/eval.py" not in source_files
    assert source_files["original/eval.py"] is FileVisibility.HIDDEN
    assert source.summary["masked_files"] == 1
    assert "repo/eval.py" in no_code_files and not any(
        p.startswith("original/") for p in no_code_files
    )


def test_nested_design_complexity_is_read(tmp_path: Path) -> None:
    """Some release questions nest ``design_complexity`` in itself: they parsed to 0 variables
    and lost their design stage (issue 38, item 7)."""
    nested = world.questions()[0]
    nested["design_complexity"] = {"design_complexity": nested["design_complexity"]}
    (question,) = expbench.plan_expbench(world.build(tmp_path, {"questions": [nested]}))[0]
    assert question.summary["variables"] == 4
    assert question.question.variables[0] == "constant_variables: learning rate 0.1"


def test_the_top_level_readme_is_masked_as_exp_bench_masks_it(ctx: Context, tmp_path: Path) -> None:
    """EXP-Bench's ``mask_repo`` (``evaluation/eval.py``) deletes the repository's top-level
    ``README.md`` before its agent starts, for every question; it is no reference script of its
    judge. A README further down stays, as there."""
    folder = world.build(tmp_path)
    (folder / "repo" / "data" / "README.md").write_text("labels, one a line\n")
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        for result in tasks.import_tasks(session, blobs, [folder]):
            files = {f.path for f in result.task.files}
            assert "repo/README.md" not in files and "original/README.md" not in files
            assert "repo/data/README.md" in files
            shown = tmp_path / "shown" / result.task.slug
            tasks.materialize_task_files(session, blobs, result.task, shown)
            every = "".join(p.read_text() for p in shown.rglob("*") if p.is_file())
            assert world.README_MARKER not in every
