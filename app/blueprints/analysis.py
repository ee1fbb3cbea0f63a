"""The analysis area of the portal."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from app.access import requires
from baseline.models import Role

bp = Blueprint("analysis", __name__, url_prefix="/analysis")


@bp.route("/")
@requires(Role.COORDINATOR, Role.ANALYST)
def index() -> Any:
    return render_template("analysis/index.html")
