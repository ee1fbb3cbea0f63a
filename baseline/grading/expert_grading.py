"""Expert grading: graders grade rubric leaves by hand, blind, several per leaf.

Each grader's work on one snapshot is one Grading of kind *expert* (grader_id set) with a
LeafGrade per leaf (score 0 or 1, the note as explanation). Blinding is enforced by what these
functions hand out: a :class:`BlindSnapshot` carries the participant's pseudonym and nothing that
identifies them (no name, kind, group or model, no attempt id), and a grader only ever gets their
own grades back. Coordinators get the agreement statistics and can export any grading as a
PaperBench graded tree.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import InvalidInput, NotFound
from baseline.grading.grading import task_rubric_and_materials
from baseline.grading.reproductions import latest_reproduction
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    LeafGrade,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Study,
    StudyStatus,
    TaskKind,
    User,
    utcnow,
)
from baseline.studies.studies import check_not_archived
from infra.blobs import BlobStore
from infra.snapshots import Manifest, diff, load_manifest
from infra.snapshots.manifest import Entry
from scoring.agreement import Agreement, agreement
from scoring.rubric import Rubric, RubricNode, format_path
from scoring.rubric_graded import graded_tree, graded_variant
from scoring.rubric_scores import Convention, aggregate
from scoring.rubric_scores import LeafGrade as ScoredLeaf

MAX_NOTE = 4000
MAX_VIEW_BYTES = 512 * 1024
MAX_DIFF_FILES = 50


@dataclass(frozen=True)
class BlindSnapshot:
    """What a grader may know about a snapshot."""

    id: int
    task_title: str
    pseudonym: str
    checkpoint: str
    graders: int  # how many graders have started on it (not what they gave)
    study_id: int = 0  # for the queue's filters: a study and a task tell no participant apart
    task_id: int = 0


@dataclass(frozen=True)
class Leaf:
    path: str
    node: RubricNode


# Graded by hand: one snapshot per checkpoint and the final one, the same number for every
# attempt whoever made it. Start, interval and manual snapshots are not in the queue: how many
# there are and when they were taken depends on who worked how (agents snapshot far more often).
GRADED_KINDS = (SnapshotKind.CHECKPOINT, SnapshotKind.FINAL)


def _checkpoint(snapshot: Snapshot) -> str:
    """The point of the attempt, without timing that could tell who made it."""
    if snapshot.kind is SnapshotKind.CHECKPOINT:
        return f"checkpoint at {snapshot.due_working_s / 3600:g} h"
    return "final submission"


def blind_label(attempt: Attempt) -> str:
    """The label graders see: one per attempt, not per participant. An agent configuration runs
    several attempts per task and a human one, so a per-participant label would show agents as
    the labels with many snapshots; per attempt, every label has one attempt's checkpoints. It is
    derived from the random pseudonym, so it carries no group either."""
    seed = f"{attempt.participant.pseudonym}:{attempt.id}".encode()
    return "S-" + hashlib.sha256(seed).hexdigest()[:6].upper()


def blind(snapshot: Snapshot, graders: int = 0) -> BlindSnapshot:
    attempt = snapshot.attempt
    return BlindSnapshot(
        id=snapshot.id,
        task_title=attempt.task.title,
        pseudonym=blind_label(attempt),
        checkpoint=_checkpoint(snapshot),
        graders=graders,
        study_id=attempt.study_id,
        task_id=attempt.task_id,
    )


def gradable(
    session: Session, study_id: int | None = None, task_id: int | None = None
) -> list[BlindSnapshot]:
    """Snapshots of paper tasks (of one study, one task, when given), fewest graders first;
    none of an archived study (`studies.check_not_archived`)."""
    query = (
        select(Snapshot)
        .join(Attempt)
        .join(Study, Attempt.study_id == Study.id)
        .where(
            Attempt.task.has(kind=TaskKind.PAPER),
            Snapshot.kind.in_(GRADED_KINDS),
            Study.status != StudyStatus.ARCHIVED,
        )
    )
    if study_id is not None:
        query = query.where(Attempt.study_id == study_id)
    if task_id is not None:
        query = query.where(Attempt.task_id == task_id)
    rows = list(session.scalars(query))
    counts: dict[int, int] = {}
    for grading in session.scalars(select(Grading).where(Grading.kind == GradingKind.EXPERT)):
        counts[grading.snapshot_id] = counts.get(grading.snapshot_id, 0) + 1
    # Not by id or time (the order runs were made in could give groups away): fewest graders,
    # then task and checkpoint, then a fixed shuffle.
    order = {
        s.id: (
            counts.get(s.id, 0),
            s.attempt.task.title,
            s.due_working_s,
            hashlib.sha256(f"queue:{s.id}:{s.attempt.participant.pseudonym}".encode()).digest(),
        )
        for s in rows
    }
    return [blind(s, counts.get(s.id, 0)) for s in sorted(rows, key=lambda s: order[s.id])]


def grader_count(session: Session, snapshot_id: int) -> int:
    """How many graders have graded the snapshot by hand (in part or whole)."""
    return (
        session.scalar(
            select(func.count())
            .select_from(Grading)
            .where(Grading.snapshot_id == snapshot_id, Grading.kind == GradingKind.EXPERT)
        )
        or 0
    )


def snapshot(session: Session, snapshot_id: int | None) -> Snapshot:
    row = None if snapshot_id is None else session.get(Snapshot, snapshot_id)
    if row is None or row.attempt.task.kind is not TaskKind.PAPER or row.kind not in GRADED_KINDS:
        raise NotFound(f"no gradable snapshot {snapshot_id}")
    return row


def leaves(session: Session, store: BlobStore, row: Snapshot) -> tuple[Rubric, list[Leaf]]:
    rubric, _ = task_rubric_and_materials(session, store, row.attempt.task)
    return rubric, [Leaf(format_path(p), n) for p, n in rubric.leaves()]


def own_grading(session: Session, row: Snapshot, grader: User) -> Grading | None:
    return session.scalar(
        select(Grading).where(
            Grading.snapshot_id == row.id,
            Grading.kind == GradingKind.EXPERT,
            Grading.grader_id == grader.id,
        )
    )


def own_grades(session: Session, row: Snapshot, grader: User) -> dict[str, LeafGrade]:
    grading = own_grading(session, row, grader)
    return {} if grading is None else {leaf.leaf_path: leaf for leaf in grading.leaves}


def save_grades(
    session: Session,
    store: BlobStore,
    row: Snapshot,
    grader: User,
    grades: dict[str, tuple[int, str]],
) -> Grading:
    """Record the grader's 0/1 grades (with notes) for some leaves; re-grading overwrites."""
    check_not_archived(row.attempt.study, "grade its snapshots")
    rubric, all_leaves = leaves(session, store, row)
    by_path = {leaf.path: leaf for leaf in all_leaves}
    for path, (score, note) in grades.items():
        if path not in by_path:
            raise InvalidInput(f"no leaf {path} in this task's rubric")
        if score not in (0, 1):
            raise InvalidInput(f"leaf {path}: a grade is 0 or 1")
        if len(note) > MAX_NOTE:
            raise InvalidInput(f"leaf {path}: the note is longer than {MAX_NOTE} characters")
    grading = own_grading(session, row, grader)
    if grading is None:
        grading = Grading(
            snapshot_id=row.id,
            kind=GradingKind.EXPERT,
            status=JobStatus.RUNNING,
            grader_id=grader.id,
            config={"expert": True},
            leaves_total=len(all_leaves),
        )
        session.add(grading)
        session.flush()
    existing = {leaf.leaf_path: leaf for leaf in grading.leaves}
    for path, (score, note) in grades.items():
        leaf = existing.get(path)
        if leaf is None:
            leaf = LeafGrade(grading=grading, leaf_path=path, leaf_id=by_path[path].node.id)
            session.add(leaf)
            existing[path] = leaf
        leaf.score, leaf.valid, leaf.explanation = float(score), True, note
    grading.leaves_graded = len(existing)
    scored = {p: ScoredLeaf(score=g.score, valid=g.valid) for p, g in existing.items()}
    tree = aggregate(rubric, scored, Convention.STRICT)
    grading.score = tree.score
    grading.raw_score = tree.root.lower
    complete = grading.leaves_graded == grading.leaves_total
    grading.status = JobStatus.SUCCEEDED if complete else JobStatus.RUNNING
    grading.finished_at = utcnow() if complete else None
    session.flush()
    audit.record(session, "grading.expert", "grading", grading.id, grader.id, leaves=sorted(grades))
    return grading


# --- what the grader reads ----------------------------------------------------------------------


def manifests(
    session: Session, store: BlobStore, row: Snapshot
) -> tuple[Manifest, Manifest | None, Reproduction | None]:
    """The snapshot as captured, as executed by its latest reproduction (if any), and that run."""
    reproduction = latest_reproduction(session, row.id)
    executed = None
    if reproduction is not None and reproduction.executed_manifest_sha256:
        executed = load_manifest(store, reproduction.executed_manifest_sha256)
    return load_manifest(store, row.manifest_sha256), executed, reproduction


def is_git_internal(path: str) -> bool:
    """Whether the path lies inside a ``.git`` directory (hooks, objects, refs): the history's
    machinery, not the submission; ``.gitignore`` and the like are ordinary files."""
    return ".git" in PurePosixPath(path).parts[:-1]


def grader_files(manifest: Manifest) -> tuple[list[Entry], int]:
    """The files a grader reads, shallowest first (the top-level README and reproduce.sh before
    what lies deep), and how many ``.git`` internals are left out: listed first, they pushed
    the real files and the leaves thousands of pixels down, and an empty repository read as
    "17 files"."""
    files = manifest.files
    shown = [f for f in files if not is_git_internal(f.path)]
    shown.sort(key=lambda f: (f.path.count("/"), f.path.lower()))
    return shown, len(files) - len(shown)


def read_file(store: BlobStore, manifest: Manifest, path: str) -> tuple[str, bool]:
    """A file's text (binary shown as a note) and whether it was cut to MAX_VIEW_BYTES."""
    entry = manifest.by_path().get(path)
    if entry is None or entry.sha256 is None:
        raise NotFound(f"no file {path} in this snapshot")
    data = store.get_bytes(entry.sha256)
    if b"\0" in data[:8192]:
        return f"(binary file, {len(data)} bytes)", False
    return data[:MAX_VIEW_BYTES].decode("utf-8", errors="replace"), len(data) > MAX_VIEW_BYTES


def previous_snapshot(session: Session, row: Snapshot) -> Snapshot | None:
    return session.scalar(
        select(Snapshot)
        .where(
            Snapshot.attempt_id == row.attempt_id,
            (Snapshot.taken_working_s < row.taken_working_s)
            | ((Snapshot.taken_working_s == row.taken_working_s) & (Snapshot.id < row.id)),
        )
        .order_by(Snapshot.taken_working_s.desc(), Snapshot.id.desc())
        .limit(1)
    )


@dataclass
class FileDiff:
    path: str
    status: str  # added, removed, changed
    lines: list[str]


def snapshot_diff(session: Session, store: BlobStore, row: Snapshot) -> list[FileDiff] | None:
    """Unified diffs of the files that changed since the previous snapshot (None: first one)."""
    previous = previous_snapshot(session, row)
    if previous is None:
        return None
    old, new = (
        load_manifest(store, previous.manifest_sha256),
        load_manifest(store, row.manifest_sha256),
    )
    change = diff(old, new)
    result: list[FileDiff] = []
    statuses = [(p, "added") for p in change.added] + [(p, "removed") for p in change.removed]
    statuses += [(p, "changed") for p in change.changed]
    for path, status in sorted(statuses)[:MAX_DIFF_FILES]:
        before = _lines(store, old, path) if status != "added" else []
        after = _lines(store, new, path) if status != "removed" else []
        lines = list(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}", lineterm=""))
        result.append(FileDiff(path, status, lines[:2000]))
    return result


def _lines(store: BlobStore, manifest: Manifest, path: str) -> list[str]:
    entry = manifest.by_path().get(path)
    if entry is None or entry.sha256 is None:
        return []
    text, _ = read_file(store, manifest, path)
    return text.splitlines()


# --- coordinators -------------------------------------------------------------------------------


def study_agreement(session: Session, study_id: int) -> Agreement:
    """Agreement of the expert grades of every snapshot of the study (a leaf of a snapshot is an
    item; graders are named by their account)."""
    if session.get(Study, study_id) is None:
        raise NotFound(f"no study {study_id}")
    rows = session.execute(
        select(Grading.snapshot_id, LeafGrade.leaf_path, User.name, User.id, LeafGrade.score)
        .join(LeafGrade, LeafGrade.grading_id == Grading.id)
        .join(User, User.id == Grading.grader_id)
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(Grading.kind == GradingKind.EXPERT, Attempt.study_id == study_id)
    )
    items: dict[str, dict[str, Any]] = {}
    for snapshot_id, path, name, user_id, score in rows:
        if score is None:
            continue
        items.setdefault(f"{snapshot_id}:{path}", {})[f"{name} (#{user_id})"] = int(score)
    return agreement(items)


def export_tree(session: Session, store: BlobStore, grading_id: int) -> dict[str, Any]:
    """Any grading with leaf grades (judge or expert) as a PaperBench graded tree.

    As PaperBench writes it: an invalid leaf is score 0 with ``valid_score`` false (a null score
    makes PaperBench's ``update_all_grades`` fail), and a Code-Dev judge grading is the pruned
    Code-Dev tree (``code_only()``) with its own root, not the full tree with the other leaves
    counted as zeros.
    """
    grading = session.get(Grading, grading_id)
    if grading is None:
        raise NotFound(f"no grading {grading_id}")
    if grading.kind is GradingKind.SCRIPT:
        raise InvalidInput(f"grading {grading_id} is a script score: it has no rubric tree")
    rubric, _ = task_rubric_and_materials(session, store, grading.snapshot.attempt.task)
    grades = {
        leaf.leaf_path: ScoredLeaf(
            score=0.0 if leaf.score is None and not leaf.valid else leaf.score,
            valid=leaf.valid,
            explanation=leaf.explanation,
            judge_metadata={**leaf.details, "cached": leaf.cached, "error": leaf.error},
        )
        for leaf in grading.leaves
    }
    if grading.kind is GradingKind.JUDGE and bool((grading.config or {}).get("code_dev")):
        return graded_variant(rubric.code_dev(), grades).to_obj()
    return graded_tree(rubric, grades).to_obj()
