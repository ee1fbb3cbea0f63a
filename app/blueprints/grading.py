"""The grading area: blind expert grading, agreement, export, and scoring progress of attempts.

Graders see a snapshot only through `baseline.grading.expert_grading`'s blind view: the
participant's pseudonym, never their name, kind, group or model, and only their own grades.
Coordinators (and admins) also see the agreement between graders, export gradings as PaperBench
graded trees, and follow the reproduction and grading progress of an attempt. Participants ask for
intermediate scores of scored tasks here.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, Response, flash, g, redirect, render_template, request, url_for

from app import listing
from app.access import STAFF, current_user, requires
from app.factory import get_context
from app.form_edits import changed_fields, touched_fields
from baseline.attempts.snapshots import store_for
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.grading import expert_grading, script_scoring
from baseline.jobs import orchestration
from baseline.models import (
    Grading,
    LeafGrade,
    Reproduction,
    Role,
    Snapshot,
    Study,
    StudyStatus,
    Task,
    User,
)
from baseline.people import visibility
from infra.blobs import BlobStore
from scoring.failure import FailureClass

bp = Blueprint("grading", __name__, url_prefix="/grading")

GRADERS = (Role.COORDINATOR, Role.GRADER)


def _user() -> User:
    user = current_user()
    assert user is not None  # guaranteed by @requires
    return user


def _store() -> BlobStore:
    return store_for(get_context())


def _snapshot_arg(name: str = "snapshot") -> Any:
    return expert_grading.snapshot(g.db, request.args.get(name, type=int))


QUEUE_PAGE = 25


@bp.route("/")
@requires(*GRADERS)
def index() -> Any:
    """The queue of snapshots to grade, a page at a time, narrowed to a study or a task."""
    study_id, task_id = listing.int_arg("study"), listing.int_arg("task")
    every = expert_grading.gradable(g.db)
    filtered = study_id is not None or task_id is not None
    rows = expert_grading.gradable(g.db, study_id, task_id) if filtered else every
    page = listing.page_of(len(rows), QUEUE_PAGE)
    study_ids = sorted({s.study_id for s in every})
    task_ids = sorted({s.task_id for s in every})
    return render_template(
        "grading/index.html",
        snapshots=rows[page.offset : page.offset + page.size],
        page=page,
        link=listing.link,
        study_choices=[g.db.get(Study, i) for i in study_ids],
        task_choices=[g.db.get(Task, i) for i in task_ids],
        chosen_study=study_id,
        chosen_task=task_id,
        coordinator=_user().role in STAFF,
        studies=visibility.studies_query(_user()),
        db=g.db,
    )


@bp.route("/snapshot", methods=["GET", "POST"])
@requires(*GRADERS)
def snapshot() -> Any:
    row = _snapshot_arg()
    store = _store()
    if request.method == "POST":
        mine = expert_grading.own_grades(g.db, row, _user())
        try:
            grades = _changed_grades(mine)
        except Conflict as exc:
            # the grader's changes stay on the page, beside the grades as they are now: saved
            # again, they are what this grader chose knowing the other tab's
            flash(exc.message, "error")
            return _snapshot_page(row, store, mine, _typed_changes()), 409
        expert_grading.save_grades(g.db, store, row, _user(), grades)
        g.db.commit()
        flash(f"{len(grades)} grade(s) saved")
        return redirect(url_for("grading.snapshot", snapshot=row.id))
    return _snapshot_page(row, store, expert_grading.own_grades(g.db, row, _user()), {})


def _snapshot_page(
    row: Snapshot, store: BlobStore, mine: dict[str, LeafGrade], typed: dict[str, str]
) -> str:
    """The blind grading page: the grader's own grades as they are (carried as shown), and on
    a refused save the changes they had made over them (`typed`)."""
    _rubric, leaves = expert_grading.leaves(g.db, store, row)
    captured, executed, reproduction = expert_grading.manifests(g.db, store, row)
    files, git_internals = expert_grading.grader_files(executed or captured)
    return render_template(
        "grading/snapshot.html",
        blind=expert_grading.blind(row),
        leaves=leaves,
        shown=_as_shown(mine),
        typed=typed,
        files=files,
        git_internals=git_internals,
        produced=set(reproduction.details.get("added", []) if reproduction else [])
        | set(reproduction.details.get("changed", []) if reproduction else []),
        reproduction=reproduction,
        failure_label=_failure_label(reproduction),
        has_previous=expert_grading.previous_snapshot(g.db, row) is not None,
        archived=row.attempt.study.status is StudyStatus.ARCHIVED,
    )


def _failure_label(reproduction: Reproduction | None) -> str | None:
    if reproduction is None or not reproduction.failure_class:
        return None
    return FailureClass(reproduction.failure_class).label


def _as_shown(mine: dict[str, LeafGrade]) -> dict[str, str]:
    """The grader's own grades now, as the grading form's fields show them."""
    shown: dict[str, str] = {}
    for path, leaf in mine.items():
        shown[f"score:{path}"] = "" if leaf.score is None else str(int(leaf.score))
        shown[f"note:{path}"] = leaf.explanation or ""
    return shown


def _field_label(name: str) -> str:
    field, path = name.split(":", 1)
    return f"leaf {path}'s {'grade' if field == 'score' else 'note'}"


def _grading_form() -> dict[str, str]:
    return {k: v for k, v in request.form.items() if k.startswith(("score:", "note:", "shown_"))}


def _typed_changes() -> dict[str, str]:
    """The grades and notes this form changed from what it showed."""
    form = _grading_form()
    return {name: form[name] for name in touched_fields(form)}


def _changed_grades(mine: dict[str, LeafGrade]) -> dict[str, tuple[int, str]]:
    """The leaves whose grade or note this form changes, each with its grade and note.

    The form carries the grades it showed; a leaf left as shown is not written again, and a
    grade or note left as shown keeps its value now. So one snapshot graded in two tabs keeps
    both tabs' changes, and a leaf changed in both is refused, not overwritten unseen. A script
    that posts without them changes every field it sends (and only those)."""
    now = _as_shown(mine)
    form = _grading_form()
    for key, value in form.items():
        if key.startswith("score:") and value not in ("", "0", "1"):
            raise InvalidInput(f"leaf {key.removeprefix('score:')}: a grade is 0 or 1")
    touched = changed_fields(
        form,
        {name: now.get(name, "") for name in form},
        label=_field_label,
        someone="you, in another tab or window",
        what_now="the page shows your grades as they are now, with this page's changes over "
        "them; save again to keep those",
    )
    grades: dict[str, tuple[int, str]] = {}
    for path in sorted({name.split(":", 1)[1] for name in touched}):
        score, note = (
            form[name] if name in touched else now.get(name, "")
            for name in (f"score:{path}", f"note:{path}")
        )
        if score == "":
            raise InvalidInput(f"leaf {path}: choose 0 or 1 (a note needs a grade)")
        grades[path] = (int(score), note.strip())
    if not grades:
        raise InvalidInput("nothing to save: choose 0 or 1 for a leaf, or change a grade or note")
    return grades


@bp.route("/file")
@requires(*GRADERS)
def file() -> Any:
    row = _snapshot_arg()
    path = request.args.get("path", "")
    captured, executed, _ = expert_grading.manifests(g.db, _store(), row)
    manifest = executed if executed is not None and request.args.get("executed") else captured
    text, cut = expert_grading.read_file(_store(), manifest, path)
    return render_template(
        "grading/file.html", blind=expert_grading.blind(row), path=path, text=text, cut=cut
    )


@bp.route("/diff")
@requires(*GRADERS)
def diff() -> Any:
    row = _snapshot_arg()
    return render_template(
        "grading/diff.html",
        blind=expert_grading.blind(row),
        diffs=expert_grading.snapshot_diff(g.db, _store(), row),
    )


@bp.route("/log")
@requires(*GRADERS)
def log() -> Any:
    row = _snapshot_arg()
    _, _, reproduction = expert_grading.manifests(g.db, _store(), row)
    if reproduction is None or not reproduction.log_sha256:
        raise NotFound("this snapshot has no reproduction log yet")
    text = _store().get_bytes(reproduction.log_sha256).decode("utf-8", errors="replace")
    return render_template(
        "grading/file.html", blind=expert_grading.blind(row), path="reproduce.log", text=text,
        cut=bool(reproduction.details.get("log_truncated")),
    )  # fmt: skip


@bp.route("/agreement/<int:study_id>")
@requires(Role.COORDINATOR)
def agreement(study_id: int) -> Any:
    study = visibility.visible_study(g.db, _user(), study_id)
    return render_template(
        "grading/agreement.html", study=study, stats=expert_grading.study_agreement(g.db, study.id)
    )


@bp.route("/export")
@requires(Role.COORDINATOR)
def export() -> Any:
    grading_id = request.args.get("grading", type=int)
    if grading_id is None or g.db.get(Grading, grading_id) is None:
        raise NotFound(f"no grading {grading_id}")
    tree = expert_grading.export_tree(g.db, _store(), grading_id)
    return Response(
        json.dumps(tree, indent=2),
        mimetype="application/json",
        headers={"Content-Disposition": f"attachment; filename=grading-{grading_id}.json"},
    )


@bp.route("/attempt/<int:attempt_id>")
@requires(Role.COORDINATOR)
def attempt_progress(attempt_id: int) -> Any:
    attempt = visibility.visible_attempt(g.db, _user(), attempt_id)
    return render_template(
        "grading/attempt.html",
        attempt=attempt,
        rows=orchestration.progress(g.db, attempt.id),
        scores=script_scoring.score_logs(g.db, attempt.id),
    )


@bp.route("/attempt/<int:attempt_id>/score", methods=["POST"])
@requires(Role.PARTICIPANT)
def intermediate_score(attempt_id: int) -> Any:
    attempt = visibility.visible_attempt(g.db, _user(), attempt_id)
    if attempt.participant.user_id != _user().id:
        raise NotFound(f"no attempt with id {attempt_id}")
    g.db.rollback()  # the scoring runs its own transactions
    log = script_scoring.intermediate_score(get_context(), attempt_id, _user().id)
    if log.floor_reason:
        flash(f"Score 0 (the task's floor: the scoring found no valid solution): {log.error}")
    elif log.error:
        flash(f"Scoring failed: {log.error}")
    else:
        flash(f"Score {log.normalised_score:.3f} (raw {log.raw_score:g})")
    return redirect(url_for("attempts.detail", attempt_id=attempt_id))
