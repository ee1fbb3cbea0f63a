"""The attempts area of the portal."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from app.access import ANY_USER, requires


bp = Blueprint("attempts", __name__, url_prefix="/attempts")


@bp.route("/")
@requires(*ANY_USER)
def index() -> Any:
    return render_template("attempts/index.html")
