"""Tasks in the portal: the list and rubric tree for staff and graders, the paper for participants.

Coordinators, admins and graders see every file and the rubric as a collapsible tree. A participant
reaches only ``/tasks/<id>/paper``, for tasks of studies they are enrolled in, and sees only the
participant-visible files (paper, addendum, instructions, blacklist); never the rubric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, g, render_template
from markdown_it import MarkdownIt
from markupsafe import Markup

from app.access import ANY_USER, current_user, requires
from app.factory import get_context
from baseline import tasks
from baseline.models import FileVisibility, Role, Task, TaskKind
from infra.blobs import BlobStore
from scoring.rubric import RubricNode, format_path

bp = Blueprint("tasks", __name__, url_prefix="/tasks")

TEXT_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".py", ".json", ".sh", ".csv")
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


def _texts(task: Task, visibility: set[FileVisibility]) -> list[dict[str, Any]]:
    """Files to show: text inline (within a size cap), Markdown rendered, others by name and
    size."""
    blobs = _blobs()
    shown = []
    for file in tasks.task_files(task, visibility):
        text = html = None
        if file.path.endswith(TEXT_SUFFIXES) and file.size <= MAX_TEXT_BYTES:
            text = tasks.read_task_file(blobs, task, file.path).decode("utf-8", "replace")
            if file.path.endswith(".md"):
                html = _markdown(text)
        shown.append({"file": file, "text": text, "html": html})
    return shown


def _markdown(text: str) -> Markup:
    """CommonMark with tables; raw HTML in the file is shown as text, never run (the task's
    author is not trusted with the portal's pages)."""
    return Markup(MarkdownIt("commonmark", {"html": False}).enable("table").render(text))


@bp.route("/")
@requires(Role.COORDINATOR, Role.GRADER)
def index() -> Any:
    return render_template("tasks/index.html", tasks=tasks.list_tasks(g.db))


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
    shown = _texts(task, {FileVisibility.PARTICIPANT})
    order = {"paper.md": 0, "instructions.md": 0, "addendum.md": 1, "blacklist.txt": 2}
    shown.sort(key=lambda item: (order.get(item["file"].path, 3), item["file"].path))
    return render_template("tasks/paper.html", task=task, shown=shown)
