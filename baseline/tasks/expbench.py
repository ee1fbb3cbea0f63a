"""EXP-Bench tasks: a paper's questions imported as tasks, and the masked starting repository.

An EXP-Bench folder holds::

    <paper_id>_complete_final.json   the paper's questions (EXP-Bench's own file)
    paper.json | <conference>.jsonl   the paper's metadata (code_url, pdf_url; JSON lines: the
      | *_withcode_popularity_stars-*.json   line whose id is the paper id)
    repo/                             a local clone of code_url at the task's commit (.git is
                                      ignored: nothing is fetched at attempt time)

A paper folder of EXP-Bench's release as it is (``outputs/logs/<conference>/<paper_id>/``) finds
its metadata in the release's ``logs/<conference>/`` instead, so the release imports unchanged
once the clones are in place; :func:`check_release` reads a whole release as the import would.
Import is all or nothing per run, and a refused paper (:class:`PaperRefused`) lists every error.

Each question becomes a task ``expbench-<paper_id>-q<index>`` of kind ``expbench`` whose files are:

- PARTICIPANT ``instructions.md`` (question, method, agent and usage instructions, the rules) and
  ``repo/...``: the repository without ``README.md`` and without the question's masked files;
- HIDDEN ``expbench.json`` (the question object with expected outcome, design variables and
  requirements, plus the paper metadata) and ``original/...``: the removed files, which the judge
  uses as the reference when it grades the implementation.

Attempts start from the masked repository in /home/submission: :func:`seed_script` copies it from
the read-only task directory and commits it in a freshly initialised repository, so the history
holds no masked content (the clone's own ``.git`` is never imported). Its ``reproduce.sh`` is the
wrapper that runs ``reproduce_exp_bench.sh``, the script EXP-Bench's execution check runs: the
platform's reproduction runs ``reproduce.sh``, and a snapshot whose ``reproduce.sh`` is no longer
the wrapper fails the check (:func:`execution_script_problem`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.scaffold import EXPBENCH_HEADING
from baseline import audit
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    Attempt,
    FileVisibility,
    Task,
    TaskFile,
    TaskKind,
    Workspace,
    WorkspacePurpose,
)
from baseline.tasks.planning import ImportResult, manifest_hash, walk_files
from infra.blobs import BlobStore
from infra.workspace import (
    PAPER_DIR,
    SUBMISSION_DIR,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
)
from scoring.exp_bench import (
    METADATA_GLOB,
    QUESTIONS_SUFFIX,
    ExpBenchError,
    PaperMeta,
    Question,
    QuestionKind,
    load_paper_meta,
    paper_id_of,
    read_questions,
)

REPO_DIR = "repo"
ORIGINAL_DIR = "original"
INSTRUCTIONS_FILE = "instructions.md"
GROUND_TRUTH_FILE = "expbench.json"
ANSWER_FILE = "exp_bench_answer.json"
EXEC_SCRIPT = "reproduce_exp_bench.sh"
REMOVED_ALWAYS = ("README.md",)
# The platform's reproduction runs reproduce.sh: in an EXP-Bench repository it runs EXP-Bench's
# script (``cd /workspace && bash reproduce_exp_bench.sh`` there), and exits with its status.
REPRODUCE_WRAPPER = f'#!/bin/bash\nexec bash {EXEC_SCRIPT} "$@"\n'


def execution_script_problem(files: Mapping[str, bytes]) -> str | None:
    """Why a snapshot's reproduction did not run EXP-Bench's script, None when it did: the
    reproduction runs ``reproduce.sh``, whose exit status is ``reproduce_exp_bench.sh``'s only
    while it is the starting wrapper. A participant who replaced it (``exit 0``) would otherwise
    pass the execution check with a failing ``reproduce_exp_bench.sh``."""
    if EXEC_SCRIPT not in files:
        return f"{EXEC_SCRIPT} is missing from the submission"
    if files.get("reproduce.sh") != REPRODUCE_WRAPPER.encode():
        return (
            f"reproduce.sh is not the starting wrapper that runs {EXEC_SCRIPT}: the "
            f"reproduction ran it instead, so {EXEC_SCRIPT} did not run as EXP-Bench runs it"
        )
    return None


def is_expbench_folder(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob(f"*{QUESTIONS_SUFFIX}"))


class PaperRefused(InvalidInput):
    """A paper folder that does not import; `errors` lists every reason (file and JSON path).
    The message is one line (the CLI's convention), the errors joined."""

    def __init__(self, folder: Path, errors: list[str]) -> None:
        count = f"{len(errors)} error{'s' if len(errors) != 1 else ''}"
        super().__init__(f"{folder}: refused ({count}): " + "; ".join(errors))
        self.errors = errors


def metadata_files(folder: Path) -> list[Path]:
    """Where the paper's metadata may be: ``paper.json``, a ``*.jsonl`` or EXP-Bench's conference
    file in the folder; else, for a folder of EXP-Bench's release as it is
    (``outputs/logs/<conference>/<paper_id>``), the conference file EXP-Bench pairs with it
    (``logs/<conference>/*_withcode_popularity_stars-*.json``)."""
    here = [folder / "paper.json"] if (folder / "paper.json").is_file() else []
    here += sorted(folder.glob("*.jsonl")) + sorted(folder.glob(METADATA_GLOB))
    if here:
        return here
    conference = folder.resolve().parent
    if _release_conference(conference):
        release = conference.parent.parent.parent
        return sorted((release / "logs" / conference.name).glob(METADATA_GLOB))
    return []


def _release_conference(folder: Path) -> bool:
    """Whether `folder` is a conference's folder of tasks in EXP-Bench's release layout
    (``outputs/logs/<conference>``)."""
    return folder.parent.name == "logs" and folder.parent.parent.name == "outputs"


@dataclass(frozen=True)
class _File:
    path: str
    visibility: FileVisibility
    source: Path | None = None
    data: bytes | None = None


@dataclass
class ExpBenchPlan:
    slug: str
    title: str
    question: Question
    files: list[_File]
    summary: dict[str, object]


def _slug(paper_id: str, index: int) -> str:
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", paper_id.lower()).strip("-") or "paper"
    return f"expbench-{cleaned}-q{index}"


def instructions(paper: PaperMeta, question: Question) -> str:
    """What the participant reads: the task, and EXP-Bench's rules and expected outputs."""
    parts = [
        f"{EXPBENCH_HEADING}: {paper.title} (question {question.index})",
        "## Question\n\n" + question.question.strip(),
    ]
    if question.method.strip():
        parts.append("## Method\n\n" + question.method.strip())
    if question.agent_instructions.strip():
        parts.append("## Instructions\n\n" + question.agent_instructions.strip())
    if question.usage_instructions.strip():
        parts.append("## Usage\n\n" + question.usage_instructions.strip())
    parts.append(
        "## Rules and deliverables\n\n"
        f"- /home/submission starts as the paper's repository (without README.md"
        f"{' and without some files you must write' if question.masked_source else ''}).\n"
        "- Do not read the paper or look it up, and do not use git history or remotes to recover "
        "code: the grader checks this, and a violation scores every stage 0.\n"
        "- Do not fake data or results.\n"
        f"- Write `{ANSWER_FILE}` at the top of /home/submission: a JSON object with `design` "
        "(the variables you held constant, varied and measured) and `conclusion` (your answer "
        "to the question, from your results).\n"
        f"- Write `{EXEC_SCRIPT}` at the top of /home/submission: it runs the whole experiment "
        "from scratch; it is executed in a fresh workspace and must exit 0 within the limit.\n"
        f"- Leave `reproduce.sh` as it is: it is what runs your `{EXEC_SCRIPT}` when the "
        "submission is executed; with a changed `reproduce.sh` the execution scores 0."
    )
    return "\n\n".join(parts) + "\n"


def repo_commit(repo: Path) -> str | None:
    """The commit the local clone is at (recorded with the task), None when it is no git clone."""
    if not (repo / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _missing_files(
    folder: Path, question: Question, repo_files: dict[str, Path], where: str
) -> list[str]:
    """Every file the question names that the local clone lacks (EXP-Bench cannot mask such a
    question either: it marks it invalid)."""
    errors: list[str] = []
    for field_name, paths in (
        ("source", question.source),
        ("masked_source", question.masked_source),
    ):
        written = question.raw.get(field_name)
        for i, path in enumerate(paths):
            if Path(path).as_posix() in repo_files:
                continue
            original = (
                written[i] if isinstance(written, list) and len(written) == len(paths) else path
            )
            named = repr(path) if original == path else f"{original!r} ({path!r} in the repository)"
            errors.append(
                f"{where}: $.questions[{question.index}].{field_name}[{i}]: {named} is not "
                f"a file of {folder / REPO_DIR}"
            )
    return errors


def _plan_question(
    paper: PaperMeta, question: Question, repo_files: dict[str, Path], commit: str | None
) -> ExpBenchPlan:
    removed = {Path(p).as_posix() for p in question.masked_source} | set(REMOVED_ALWAYS)
    files = [
        _File(
            INSTRUCTIONS_FILE,
            FileVisibility.PARTICIPANT,
            data=instructions(paper, question).encode(),
        )
    ]
    for path, source in sorted(repo_files.items()):
        if path in removed:
            files.append(_File(f"{ORIGINAL_DIR}/{path}", FileVisibility.HIDDEN, source=source))
        else:
            files.append(_File(f"{REPO_DIR}/{path}", FileVisibility.PARTICIPANT, source=source))
    truth = {
        "paper": {
            "paper_id": paper.paper_id,
            "title": paper.title,
            "code_url": paper.code_url,
            "pdf_url": paper.pdf_url,
            "repo_commit": commit,
        },
        "index": question.index,
        "kind": question.kind.value,
        "question": question.raw,
    }
    files.append(
        _File(
            GROUND_TRUTH_FILE,
            FileVisibility.HIDDEN,
            data=json.dumps(truth, sort_keys=True, indent=1).encode(),
        )
    )
    title = " ".join(question.question.split())
    return ExpBenchPlan(
        slug=_slug(paper.paper_id, question.index),
        title=f"{paper.title}: {title[:150]}",
        question=question,
        files=files,
        summary={
            "expbench_kind": question.kind.value,
            "paper_id": paper.paper_id,
            "variables": len(question.variables),
            "requirements": len(question.requirements),
            "masked_files": len(question.masked_source),
            "repo_commit": commit,
        },
    )


def plan_expbench(folder: Path) -> tuple[list[ExpBenchPlan], list[str]]:
    """Every question of the folder planned as a task (nothing stored); the skipped names.

    All or nothing: a folder with any error is refused (:class:`PaperRefused`) with every error
    found, the questions file, the metadata and each question's files all checked."""
    folder = Path(folder)
    found = sorted(folder.glob(f"*{QUESTIONS_SUFFIX}"))
    if len(found) != 1:
        raise PaperRefused(
            folder, [f"{folder}: expected one *{QUESTIONS_SUFFIX}, found {len(found)}"]
        )
    questions_path = found[0]
    paper_id = paper_id_of(questions_path)
    errors: list[str] = []
    questions: list[Question] = []
    try:
        questions, errors = read_questions(questions_path)
    except ExpBenchError as exc:
        errors += exc.errors
    metas = metadata_files(folder)
    paper = PaperMeta(paper_id, paper_id, None, None)
    if len(metas) != 1:
        errors.append(
            f"{folder}: expected the paper metadata as paper.json, one *.jsonl or one "
            f"{METADATA_GLOB} (here or in EXP-Bench's logs/<conference>/), found {len(metas)}"
            + (f": {', '.join(str(m) for m in metas)}" if metas else "")
        )
    else:
        try:
            paper = load_paper_meta(metas[0], paper_id)
        except ExpBenchError as exc:
            errors += exc.errors
    skipped: list[str] = []
    repo_files: dict[str, Path] = {}
    repo = folder / REPO_DIR
    if repo.is_dir():
        for path in walk_files(repo, repo, skipped):
            relative = path.relative_to(repo).as_posix()
            if relative == ".git" or relative.startswith(".git/"):
                continue  # the clone's history would hold the masked files
            repo_files[relative] = path
    with_code = [q.index for q in questions if q.kind is not QuestionKind.NO_CODE]
    if with_code and not repo_files:
        errors.append(
            f"{questions_path}: questions {', '.join(map(str, with_code))} name repository "
            f"files but {repo} is missing or empty: put a local clone of the paper's repository "
            "there" + (f" ({paper.code_url})" if paper.code_url else "")
        )
    else:
        for question in questions:
            errors += _missing_files(folder, question, repo_files, str(questions_path))
    if errors:
        raise PaperRefused(folder, errors)
    commit = repo_commit(repo)
    plans = [_plan_question(paper, q, repo_files, commit) for q in questions]
    known = {questions_path.name, REPO_DIR, *(m.name for m in metas if m.parent == folder)}
    skipped += sorted(p.name for p in folder.iterdir() if p.name not in known)
    return plans, skipped


@dataclass(frozen=True)
class PaperCheck:
    """One paper folder of a release checked: its questions by kind, or every error."""

    folder: Path
    kinds: dict[str, int]
    errors: list[str]

    @property
    def imports(self) -> bool:
        return not self.errors


def release_papers(root: Path) -> list[Path]:
    """The paper folders under `root` (itself included): each folder holding a questions file,
    EXP-Bench's name or a variant of it (such a folder is checked, and refused unless it has one
    ``*_complete_final.json``, the only name EXP-Bench's pipeline reads). In the release layout
    only the folders EXP-Bench runs are papers: those of ``outputs/logs/<conference>`` named by
    a paper id (its ``archived/`` is not). Clones and hidden folders are not searched."""
    found: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != REPO_DIR
            and not d.startswith(".")
            and (d.isdigit() or not _release_conference(here.resolve()))
        )
        if any(re.search(r"_complete_final.*\.json$", name) for name in filenames):
            found.add(here)
    return sorted(found)


def check_release(root: Path) -> list[PaperCheck]:
    """Every paper folder of a release planned as its import would plan it (nothing stored)."""
    checks: list[PaperCheck] = []
    for folder in release_papers(Path(root)):
        try:
            plans, _ = plan_expbench(folder)
        except PaperRefused as exc:
            checks.append(PaperCheck(folder, {}, exc.errors))
            continue
        kinds: dict[str, int] = {}
        for plan in plans:
            kinds[plan.question.kind.value] = kinds.get(plan.question.kind.value, 0) + 1
        checks.append(PaperCheck(folder, kinds, []))
    return checks


def import_expbench(
    session: Session, blobs: BlobStore, folder: Path, actor_id: int | None = None
) -> list[ImportResult]:
    """Import one EXP-Bench folder: one task per question; identical content is a no-op and
    changed content under an existing slug a Conflict, as for every task."""
    plans, skipped = plan_expbench(folder)
    results: list[ImportResult] = []
    for plan in plans:
        stored: list[tuple[_File, str, int]] = []
        for file in plan.files:
            if file.data is not None:
                stored.append((file, blobs.put_bytes(file.data), len(file.data)))
            else:
                assert file.source is not None
                digest, size = blobs.put_file(file.source)
                stored.append((file, digest, size))
        content_hash = manifest_hash(
            TaskKind.EXPBENCH, [(f.path, digest, f.visibility.value) for f, digest, _ in stored]
        )
        existing = session.scalar(select(Task).where(Task.slug == plan.slug))
        if existing is not None:
            if existing.content_hash != content_hash:
                raise Conflict(
                    f"task {plan.slug!r} exists with different content; "
                    "give the changed paper a new id"
                )
            results.append(ImportResult(existing, created=False, skipped=skipped))
            continue
        task = Task(
            slug=plan.slug,
            title=plan.title[:500],
            kind=TaskKind.EXPBENCH,
            content_hash=content_hash,
            summary=plan.summary,
            scoring=None,
        )
        task.files = [
            TaskFile(path=f.path, sha256=digest, size=size, visibility=f.visibility)
            for f, digest, size in stored
        ]
        session.add(task)
        session.flush()
        audit.record(
            session,
            "task.import",
            "task",
            task.id,
            actor_id,
            slug=task.slug,
            content_hash=content_hash,
        )
        results.append(ImportResult(task, created=True, skipped=skipped))
    return results


def seed_script(submission_dir: str, task_dir: str = PAPER_DIR) -> str:
    """Shell run once in a new workspace: the masked repository becomes the submission, committed
    in a fresh repository (no earlier history exists, so none can hold masked content). A
    submission that already has a commit (a restart) is left alone. ``reproduce.sh`` is the
    wrapper that runs ``reproduce_exp_bench.sh`` (a repository's own top-level ``reproduce.sh``
    included: the platform's reproduction runs ``reproduce.sh``, and EXP-Bench's execution check
    runs ``reproduce_exp_bench.sh``)."""
    sub, repo = shlex.quote(submission_dir), shlex.quote(f"{task_dir}/{REPO_DIR}")
    wrapper = shlex.quote(REPRODUCE_WRAPPER)
    return (
        f"set -e; cd {sub}; "
        "if git rev-parse -q --verify HEAD >/dev/null 2>&1; then exit 0; fi; "
        "rm -rf .git; git init -q -b main .; "
        f"if [ -d {repo} ]; then cp -R {repo}/. .; fi; "
        f"printf %s {wrapper} > reproduce.sh; "
        "git add -A; "
        "git -c user.name=baseline -c user.email=baseline@localhost "
        "commit -q -m 'EXP-Bench starting repository' --allow-empty"
    )


def seed_submission(
    session: Session, workspace: Workspace, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> None:
    """Put the masked repository into a new attempt workspace of an EXP-Bench task (no-op for
    other workspaces, and for a submission that already has a commit)."""
    if workspace.purpose is not WorkspacePurpose.ATTEMPT or workspace.attempt_id is None:
        return
    attempt = session.get(Attempt, workspace.attempt_id)
    if attempt is None or attempt.task.kind is not TaskKind.EXPBENCH:
        return
    result = backend.exec(
        handle, ["bash", "-c", seed_script(SUBMISSION_DIR)], workdir=SUBMISSION_DIR, timeout_s=300
    )
    if result.exit_code != 0:
        output = result.output.decode(errors="replace").strip()[-500:]
        raise WorkspaceError(f"seeding the EXP-Bench repository failed: {output}")
