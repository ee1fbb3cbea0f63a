"""The tasks area of the portal."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from app.access import requires
from baseline.models import Role

bp = Blueprint("tasks", __name__, url_prefix="/tasks")


@bp.route("/")
@requires(Role.COORDINATOR, Role.GRADER)
def index() -> Any:
    return render_template("tasks/index.html")
