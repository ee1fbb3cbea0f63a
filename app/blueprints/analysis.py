"""The analyst dashboard: a study's interactive figures, narrowed by task, group and checkpoint.

The figures are computed by `analysis.report` (the same code as `baseline plot`) and drawn in the
browser by the plotly.js bundled with the installed plotly package, served from here: the portal
works with no internet access.
"""

from __future__ import annotations

import functools
import io
import json
import tempfile
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from flask import Blueprint, Response, g, render_template, request

from app.access import current_user, requires
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import Role
from baseline.people import visibility
from baseline.studies import studies

bp = Blueprint("analysis", __name__, url_prefix="/analysis")

PORTAL_RESAMPLES = 500  # only the crossover's share of replicates crossing is resampled
TABLE_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
IMAGE_TYPES = {"png": "image/png", "svg": "image/svg+xml"}


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


def _intervals(raw: str | None) -> Literal["auto", "anytime", "fixed"]:
    if raw is None or raw in ("", "auto"):
        return "auto"
    if raw == "anytime":
        return "anytime"
    if raw == "fixed":
        return "fixed"
    raise InvalidInput(f"intervals: choose auto, anytime or fixed, not {raw[:40]!r}")


def _filters() -> Any:
    from analysis import report

    return report.Filters(
        tasks=[t for t in request.args.getlist("task") if t],
        groups=[x for x in request.args.getlist("group") if x],
        checkpoint=_checkpoint(request.args.get("checkpoint")),
        carry_forward=request.args.get("carry_forward") == "1",
        own_tasks=request.args.get("own_tasks") == "1",
        intervals=_intervals(request.args.get("intervals")),
        n_boot=PORTAL_RESAMPLES,
    )


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
    filters = _filters()  # a bad checkpoint or intervals is answered before the study is read
    data = load_study(raw_study, session=g.db)
    study = studies.get_study(g.db, data.study_id)
    try:
        result = report.analyse(data, filters)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    from analysis.intervals import METHOD_DETAIL
    from analysis.sequential import CS_DETAIL

    figures = {name: json.loads(fig.to_json()) for name, fig in report.figures(result).items()}
    return render_template(
        "analysis/index.html",
        studies=all_studies,
        data=data,
        # The study's own tasks and groups, so that the filters are there before any score is.
        task_choices=sorted(set(data.tasks) | {t.slug for t in studies.study_tasks(g.db, study)}),
        group_choices=sorted(set(data.groups) | {p.group for p in study.participants}),
        query=urlencode(
            [("study", data.study_id)]
            + [(k, v) for k, v in request.args.items(multi=True) if k != "study"]
        ),
        filters=filters,
        figures=figures,
        crossovers=result.crossovers,
        notes=result.notes,
        sizes=result.sizes.to_dict("records") if len(result.traj) else [],
        method=CS_DETAIL if result.anytime else METHOD_DETAIL,
        anytime=result.anytime,
        hours=sorted({p.hours for c in result.crossovers for p in c.paired}),
        n_attempts=int(result.traj["attempt_id"].nunique()) if len(result.traj) else 0,
    )


def _study_arg() -> int:
    raw = request.args.get("study", "")
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"study: expected a study id, got {raw[:40]!r}")
    return int(raw)


@bp.route("/table.<fmt>")
@requires(Role.COORDINATOR, Role.ANALYST)
def table(fmt: str) -> Any:
    """The study's tidy table (?study=ID) as CSV or Parquet: what the figures are drawn from."""
    from analysis import load_study, report

    if fmt not in TABLE_TYPES:
        raise NotFound(f"no table format {fmt!r}: csv or parquet")
    data = load_study(_study_arg(), session=g.db)
    buffer = io.BytesIO()
    if fmt == "csv":
        buffer.write(report.csv_text(data.table).encode())
    else:
        data.table.to_parquet(buffer, index=False)
    return _attachment(buffer.getvalue(), TABLE_TYPES[fmt], f"study-{data.study_id}-table.{fmt}")


@bp.route("/figure/<name>.<fmt>")
@requires(Role.COORDINATOR, Role.ANALYST)
def figure(name: str, fmt: str) -> Any:
    """One figure of the dashboard, with the dashboard's filters, as PNG or SVG."""
    from analysis import load_study, report

    if fmt not in IMAGE_TYPES:
        raise NotFound(f"no image format {fmt!r}: png or svg")
    if name not in report.FIGURES:
        raise NotFound(f"no figure {name!r}; figures: {', '.join(report.FIGURES)}")
    data = load_study(_study_arg(), session=g.db)
    try:
        result = report.analyse(data, _filters())
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    drawn = report.figures(result, (name,))
    if name not in drawn:
        raise NotFound(f"figure {name!r} has nothing to draw for this study and these filters")
    with tempfile.TemporaryDirectory(prefix="baseline-figure-") as tmp:
        path = Path(tmp) / f"{name}.{fmt}"
        try:
            report.write_figure(drawn[name], path)
        except RuntimeError as exc:
            raise Conflict(str(exc)) from exc
        body = path.read_bytes()
    return _attachment(body, IMAGE_TYPES[fmt], f"study-{data.study_id}-{name}.{fmt}")


def _attachment(body: bytes, mimetype: str, filename: str) -> Response:
    return Response(
        body,
        mimetype=mimetype,
        headers={"Content-Disposition": f"attachment; filename={filename}"},
    )


_PLAN_FLOATS = ("task_sd", "attempt_sd", "zero_share_a", "zero_share_b", "power", "limit_hours")
_PLAN_INTS = ("attempts_a", "attempts_b", "tasks_per_human", "studies", "max_tasks")
_PLAN_COSTS = {
    "human_hourly_usd": float,
    "gpu_hourly_usd": float,
    "gpus_per_workspace": int,
    "judge_usd_per_snapshot": float,
    "agent_usd_per_attempt": float,
}


def _plan_number(name: str, kind: type[int] | type[float]) -> int | float | None:
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError as exc:
        raise InvalidInput(f"{name.replace('_', ' ')}: not a number: {raw[:40]!r}") from exc


def _plan_checkpoints(raw: str) -> list[dict[str, float]]:
    out = []
    for item in (part.strip() for part in raw.replace("\n", ",").split(",")):
        if not item:
            continue
        try:
            hours, mean_a, mean_b = (float(x) for x in item.split(":"))
        except ValueError as exc:
            raise InvalidInput(
                f"checkpoints: {item[:40]!r} is not HOURS:MEAN_A:MEAN_B (e.g. 8:0.30:0.45)"
            ) from exc
        out.append({"hours": hours, "mean_a": mean_a, "mean_b": mean_b})
    return out


@bp.route("/plan")
@requires(Role.COORDINATOR, Role.ANALYST)
def plan() -> Any:
    """The study planner: stated guesses or a pilot study in, tasks needed and cost out."""
    from analysis import planner, plots

    form = {k: v for k, v in request.args.items() if k != "run"}
    context: dict[str, Any] = {
        "form": form,
        "studies": studies.list_studies(g.db),
        "result": None,
        "figure": None,
        "max_scores": planner.PORTAL_MAX_SCORES,
    }
    if request.args.get("run") != "1":
        return render_template("analysis/plan.html", **context)
    try:
        result = _run_plan()
    except InvalidInput as exc:  # shown above the form, which keeps what was typed
        return render_template("analysis/plan.html", error=str(exc), **context), 422
    figure = plots.power_figure(result)
    context.update(result=result, figure=json.loads(figure.to_json()))
    return render_template("analysis/plan.html", **context)


def _run_plan() -> Any:
    from analysis import planner

    values: dict[str, Any] = {
        "group_a": request.args.get("group_a", "human").strip() or "human",
        "group_b": request.args.get("group_b", "agent").strip() or "agent",
    }
    given: dict[str, Any] = {}
    for name in _PLAN_FLOATS:
        number = _plan_number(name, float)
        if number is not None:
            given[name] = number
    for name in _PLAN_INTS:
        number = _plan_number(name, int)
        if number is not None:
            given[name] = number
    if request.args.get("shape") in ("bounded", "positive"):
        given["shape"] = request.args["shape"]
    costs = {}
    for name, kind in _PLAN_COSTS.items():
        number = _plan_number(name, kind)
        if number is not None:
            costs[name] = number
    guesses = _plan_checkpoints(request.args.get("checkpoints", ""))
    pilot = request.args.get("pilot", "")
    data = None
    if pilot:
        if not pilot.isdigit():
            raise InvalidInput(f"pilot: expected a study id, got {pilot[:40]!r}")
        from analysis import load_study

        viewer = current_user()
        assert viewer is not None  # @requires let only signed-in staff through
        data = load_study(visibility.visible_study(g.db, viewer, int(pilot)).id, session=g.db)
    try:
        spec = planner.build_spec(data, values["group_a"], values["group_b"], guesses, given, costs)
        result = planner.plan(spec, max_scores=planner.PORTAL_MAX_SCORES)
    except planner.PlanError as exc:
        raise InvalidInput(str(exc)) from exc
    return result
