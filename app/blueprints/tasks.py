"""Tasks in the portal: the list and rubric tree for staff and graders, the paper for participants.

Coordinators, admins and graders see every file and the rubric as a collapsible tree. A participant
reaches only ``/tasks/<id>/paper`` and ``/tasks/<id>/files/<path>``, for tasks of studies they are
enrolled in, and sees only the participant-visible files; never the rubric or the judge's addendum.
The task view is what a participant works from, so it reads as a document: the paper with its
addendum (PaperBench's participant-facing clarifications), the instructions, the sites that are off
limits, and the resources (every other file, downloadable, also in /home/paper).
"""

from __future__ import annotations

import mimetypes
import re
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, flash, g, redirect, render_template, request, url_for
from markdown_it import MarkdownIt
from markupsafe import Markup

from app.access import ANY_USER, STAFF, current_user, requires
from app.factory import get_context
from app.task_archive import unpacked
from baseline.errors import DomainError, InvalidInput, NotFound
from baseline.models import FileVisibility, Role, Task, TaskFile, TaskKind
from baseline.tasks import expbench, tasks
from infra.blobs import BlobStore
from scoring import task_standard_normalisation as normalisation
from scoring.rubric import RubricNode, format_path

bp = Blueprint("tasks", __name__, url_prefix="/tasks")

MAX_TEXT_BYTES = 2 * 1024 * 1024


@dataclass
class TreeRow:
    path: str
    node: RubricNode
    leaves: int
    children: list[TreeRow] = field(default_factory=list)


def _tree(node: RubricNode, path: tuple[int, ...] = ()) -> TreeRow:
    children = [_tree(child, (*path, i)) for i, child in enumerate(node.sub_tasks)]
    leaves = sum(c.leaves for c in children) if children else 1
    return TreeRow(format_path(path) or "root", node, leaves, children)


def _blobs() -> BlobStore:
    return BlobStore(get_context().settings.blob_dir)


# The participant's task view, in reading order; every other visible file is a resource.
PAPER_FILE, ADDENDUM_FILE, BLACKLIST_FILE = "paper.md", "addendum.md", "blacklist.txt"
# Shown in the browser; every other type (SVG, HTML, archives) is sent as a download.
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf"})


@dataclass
class TaskView:
    """What a participant reads: rendered documents, the blacklist's entries, the resources."""

    paper: Markup | None = None
    addendum: Markup | None = None
    instructions: list[tuple[str, Markup]] = field(default_factory=list)
    blacklist: list[str] | None = None  # None: the task has no blacklist file
    resources: list[TaskFile] = field(default_factory=list)


def _task_view(task: Task) -> TaskView:
    blobs = _blobs()
    base = url_for("tasks.file", task_id=task.id, path="")
    view = TaskView()
    for file in tasks.task_files(task, {FileVisibility.PARTICIPANT}):
        top_level_md = file.path.endswith(".md") and "/" not in file.path
        if (top_level_md or file.path == BLACKLIST_FILE) and file.size <= MAX_TEXT_BYTES:
            text = tasks.read_task_file(blobs, task, file.path).decode("utf-8", "replace")
            if file.path == PAPER_FILE:
                view.paper = _markdown(text, base)
            elif file.path == ADDENDUM_FILE:
                view.addendum = _markdown(text, base)
            elif file.path == BLACKLIST_FILE:
                view.blacklist = tasks.parse_blacklist(text)
            else:
                view.instructions.append((file.path, _markdown(text, base)))
        else:
            view.resources.append(file)
    return view


def _markdown(text: str, base: str = "") -> Markup:
    """CommonMark with tables; raw HTML in the file is shown as text, never run (the task's
    author is not trusted with the portal's pages). Relative image and link targets (a paper's
    ``assets/fig1.png``) point at the task's files under `base`."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    html = md.render(text)
    if base:
        html = _RELATIVE.sub(lambda m: f'{m.group(1)}="{base}{m.group(2)}"', html)
    return Markup(html)


# A src or href that is neither absolute, nor rooted, nor a fragment, mailto: or data:.
_RELATIVE = re.compile(r'\b(src|href)="(?![a-zA-Z][a-zA-Z0-9+.-]*:|/|#)([^"]+)"')


MISSING_FILES = [m.value for m in expbench.MissingFiles]


@bp.route("/")
@requires(Role.COORDINATOR, Role.GRADER)
def index() -> Any:
    return _index_page()


def _index_page(status: int = 200) -> Any:
    user = current_user()
    staff = user is not None and user.role in STAFF
    page = render_template(
        "tasks/index.html",
        tasks=tasks.list_tasks(g.db),
        staff=staff,
        missing_files=MISSING_FILES,
        form=request.form,
    )
    return page, status


def _family_settings() -> normalisation.NormalisationSettings | None:
    """The form's normalisation settings of a Task Standard family, one KEY=VALUE a line."""
    lines = [x.strip() for x in request.form.get("settings", "").splitlines() if x.strip()]
    if not lines:
        return None
    try:
        return normalisation.parse_set(lines)
    except normalisation.NormalisationError as exc:
        raise InvalidInput(f"settings: {str(exc).replace('--set ', '')}") from None


@bp.route("/import", methods=["POST"])
@requires(*STAFF)
def import_archive() -> Any:
    """Import the tasks of an uploaded folder archive, as `baseline task import` does: a
    PaperBench paper folder, a scored-task folder, an EXP-Bench paper folder or a METR Task
    Standard family folder; all its tasks are validated before any is stored."""
    upload = request.files.get("archive")
    user = current_user()
    assert user is not None
    try:
        if upload is None or not upload.filename:
            raise InvalidInput("archive: choose a .tar.gz of a task folder")
        missing = request.form.get("expbench_missing_files", expbench.MissingFiles.SKIP.value)
        if missing not in MISSING_FILES:
            raise InvalidInput(f"expbench missing files: one of {', '.join(MISSING_FILES)}")
        settings = _family_settings()
        with unpacked(upload.stream) as folder:
            results = tasks.import_tasks(
                g.db,
                _blobs(),
                [folder],
                user.id,
                family_settings=settings,
                expbench_missing_files=expbench.MissingFiles(missing),
            )
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return _index_page(exc.status_code)
    for result in results:
        row = result.counts()
        state = "Imported" if row["created"] else "Unchanged (already imported)"
        leaves = f", {row['leaves']} leaves" if row["leaves"] is not None else ""
        note = f"; not imported: {', '.join(row['skipped'])}" if row["skipped"] else ""
        warn = "".join(f"; warning: {w}" for w in row["warnings"])
        what = f"{row['slug']} ({row['kind']}, {row['files']} files{leaves})"
        flash(f"{state}: {what}{note}{warn}", "success")
    return redirect(url_for("tasks.index"), 303)


@bp.route("/<int:task_id>")
@requires(Role.COORDINATOR, Role.GRADER)
def detail(task_id: int) -> Any:
    task = tasks.get_task(g.db, task_id)
    tree = None
    rubric_error = None
    if task.kind is TaskKind.PAPER:
        if any(f.path == tasks.RUBRIC_FILE for f in task.files):
            tree = _tree(tasks.load_task_rubric(g.db, _blobs(), task).root)
        else:
            rubric_error = "This task has no rubric.json."
    return render_template(
        "tasks/detail.html",
        task=task,
        files=sorted(task.files, key=lambda f: f.path),
        tree=tree,
        rubric_error=rubric_error,
    )


@bp.route("/<int:task_id>/paper")
@requires(*ANY_USER)
def paper(task_id: int) -> Any:
    user = current_user()
    assert user is not None
    task = tasks.visible_task(g.db, user, task_id)
    return render_template("tasks/paper.html", task=task, view=_task_view(task))


@bp.route("/<int:task_id>/files/<path:path>")
@requires(*ANY_USER)
def file(task_id: int, path: str) -> Any:
    """One participant-visible file of the task (a resource, or an image the paper shows)."""
    user = current_user()
    assert user is not None
    task = tasks.visible_task(g.db, user, task_id)
    if not any(f.path == path for f in tasks.task_files(task, {FileVisibility.PARTICIPANT})):
        raise NotFound(f"task {task_id} has no file {path!r} for participants")
    mimetype = mimetypes.guess_type(path)[0] or "application/octet-stream"
    if mimetype.startswith("text/") or path.endswith((".md", ".yaml", ".yml", ".py", ".json")):
        mimetype = "text/plain; charset=utf-8"  # shown as text, never run as a page
    response = Response(tasks.read_task_file(_blobs(), task, path), mimetype=mimetype)
    if mimetype not in INLINE_TYPES and not mimetype.startswith("text/plain"):
        # An author's SVG or HTML opened on the portal's origin could run script: download it.
        name = path.rsplit("/", 1)[-1].replace('"', "")
        response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
