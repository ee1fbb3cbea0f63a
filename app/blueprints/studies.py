"""Studies: list, create, configure, enrol participants."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g, render_template

from app.access import ANY_USER, requires
from baseline import studies

bp = Blueprint("studies", __name__, url_prefix="/studies")


@bp.route("/")
@requires(*ANY_USER)
def index() -> Any:
    return render_template("studies/index.html", studies=studies.list_studies(g.db))
