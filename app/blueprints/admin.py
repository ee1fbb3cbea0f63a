"""Administration: users, invitations, audit log."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from app.access import requires
from baseline.models import Role

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.route("/")
@requires(Role.ADMIN)
def index() -> Any:
    return render_template("admin/index.html")
