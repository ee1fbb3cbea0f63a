"""The analyst dashboard: a study's interactive figures, narrowed by task, group and checkpoint.

The figures are computed by `analysis.report` (the same code as `baseline plot`) and drawn in the
browser by the plotly.js bundled with the installed plotly package, served from here: the portal
works with no internet access.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from flask import Blueprint, Response, g, render_template, request

from app.access import requires
from baseline import studies
from baseline.errors import InvalidInput
from baseline.models import Role

bp = Blueprint("analysis", __name__, url_prefix="/analysis")

PORTAL_RESAMPLES = 500  # only the crossover's share of replicates crossing is resampled


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@bp.route("/plotly.min.js")
@requires(Role.COORDINATOR, Role.ANALYST)
def plotly_js() -> Response:
    response = Response(_plotly_js(), mimetype="application/javascript")
    response.headers["Cache-Control"] = "private, max-age=86400"
    return response


def _checkpoint(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise InvalidInput(f"checkpoint: not a number of hours: {raw!r}") from exc


@bp.route("/")
@requires(Role.COORDINATOR, Role.ANALYST)
def index() -> Any:
    from analysis import load_study, report

    all_studies = studies.list_studies(g.db)
    raw_study = request.args.get("study", "")
    if not raw_study:
        if not all_studies:
            return render_template("analysis/index.html", studies=[], data=None)
        raw_study = str(all_studies[-1].id)
    if not raw_study.isdigit():
        raise InvalidInput(f"study: expected a study id, got {raw_study!r}")
    data = load_study(raw_study, session=g.db)
    filters = report.Filters(
        tasks=[t for t in request.args.getlist("task") if t],
        groups=[x for x in request.args.getlist("group") if x],
        checkpoint=_checkpoint(request.args.get("checkpoint")),
        carry_forward=request.args.get("carry_forward") == "1",
        n_boot=PORTAL_RESAMPLES,
    )
    try:
        result = report.analyse(data, filters)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    from analysis.intervals import METHOD_DETAIL

    figures = {name: json.loads(fig.to_json()) for name, fig in report.figures(result).items()}
    return render_template(
        "analysis/index.html",
        studies=all_studies,
        data=data,
        filters=filters,
        figures=figures,
        crossovers=result.crossovers,
        notes=result.notes,
        sizes=result.sizes.to_dict("records") if len(result.traj) else [],
        method=METHOD_DETAIL,
        hours=sorted({p.hours for c in result.crossovers for p in c.paired}),
        n_attempts=int(result.traj["attempt_id"].nunique()) if len(result.traj) else 0,
    )
