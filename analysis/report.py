"""From a loaded study and a set of filters to the figures and files analysts ask for.

The portal dashboard, `baseline plot` and `baseline export` all go through here, so they agree.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
import plotly.graph_objects as go
from pydantic import BaseModel, Field

from analysis import plots, stats
from analysis.export_browser import EXPORT_BROWSER
from analysis.table import TERMINAL, StudyData

FIGURES = (
    "trajectories",
    "tasks",
    "best_of_k",
    "cost",
    "categories",
    "stages",
    "failures",
    "agreement",
)
EXPORT_FORMATS = ("csv", "parquet", "json")
SUMMARIES = ("curves", "best_of_k", "crossover")
BEST_OF_K = (1, 2, 4)
# The crossover summary's columns (one row per paired checkpoint of a human-agent comparison).
CROSSOVER_COLUMNS = (
    "early_leader", "late_leader", "checkpoint_hours", "paired_difference", "lo", "hi",
    "n_tasks", "n_attempts_early", "n_attempts_late", "leader", "separated", "tie_tolerance",
    "crossings", "crossover_hours", "crossover_lo_hours", "crossover_hi_hours",
    "first_separated_hours", "tasks_compared", "level", "method", "note",
)  # fmt: skip
# Every summary's header, written even when it has no rows, so that a reader's tooling (a CSV
# reader, a column lookup) meets the same table with nothing scored as with everything.
SUMMARY_COLUMNS = {
    "curves": stats.CURVE_COLUMNS,
    "best_of_k": stats.BEST_OF_K_COLUMNS,
    "crossover": CROSSOVER_COLUMNS,
}
IMAGE_SUFFIXES = (".png", ".svg")
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


class Filters(BaseModel):
    """What the analyst narrowed the study to; empty lists mean everything."""

    tasks: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    checkpoint: float | None = None  # the checkpoint the breakdown bars show
    carry_forward: bool = False
    own_tasks: bool = False  # group curves over each group's own tasks, not the shared ones
    # "anytime": confidence sequences (valid however often the study is looked at); "fixed":
    # fixed-n intervals (the final report's); "auto": anytime while an attempt is still live.
    intervals: Literal["auto", "anytime", "fixed"] = "auto"
    n_boot: int = Field(default=1000, ge=100, le=20_000)
    level: float = Field(default=0.95, gt=0, lt=1)
    hourly_rate: float | None = Field(default=None, ge=0)


@dataclass
class Report:
    data: StudyData
    filters: Filters
    traj: pd.DataFrame
    curves: pd.DataFrame
    crossovers: list[stats.CrossoverResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # comparisons refused, and why
    anytime: bool = False  # the curves' intervals are confidence sequences

    @property
    def sizes(self) -> pd.DataFrame:
        return stats.group_sizes(self.traj) if len(self.traj) else pd.DataFrame()


def analyse(data: StudyData, filters: Filters | None = None) -> Report:
    """Trajectories and group curves of the filtered study (one bootstrap, shared by figures)."""
    chosen = filters or Filters()
    table = data.table
    if chosen.tasks:
        unknown = sorted(set(chosen.tasks) - set(data.tasks))
        if unknown:
            raise ValueError(f"no such task in {data.name}: {', '.join(unknown)}")
        table = table[table["task"].isin(chosen.tasks)]
    if chosen.groups:
        unknown = sorted(set(chosen.groups) - set(data.groups))
        if unknown:
            raise ValueError(f"no such group in {data.name}: {', '.join(unknown)}")
        table = table[table["group"].isin(chosen.groups)]
    checkpoints = data.checkpoints or stats.default_checkpoints(table)
    if chosen.checkpoint is not None and chosen.checkpoint not in checkpoints:
        raise ValueError(f"{chosen.checkpoint:g} h is not a checkpoint of {data.name}")
    traj = stats.trajectories(table, checkpoints, carry_forward=chosen.carry_forward)
    if traj.empty:
        return Report(data, chosen, traj, pd.DataFrame())
    groups = sorted(traj["group"].unique())
    shared = stats.shared_tasks(traj)
    like_for_like = len(groups) > 1 and bool(shared) and not chosen.own_tasks
    ended = [status.value for status in TERMINAL]  # no more scores are coming from these
    live = bool((~table["attempt_status"].isin(ended)).any())
    anytime = chosen.intervals == "anytime" or (chosen.intervals == "auto" and live)
    curves = stats.group_curves(
        traj, level=chosen.level, tasks=shared if like_for_like else None, anytime=anytime
    )
    sequential = bool((curves["interval"] == "anytime").any()) if len(curves) else False
    report = Report(data, chosen, traj, curves, anytime=sequential)
    if anytime and not sequential:
        report.notes.append(
            "Anytime-valid intervals need scores in a known range (rubric and EXP-Bench tasks); "
            "this selection includes scored tasks, so the curves show fixed-n intervals, which "
            "hold for one look only, not for a study looked at every day."
        )
    if len(groups) > 1 and not shared:
        report.notes.append(
            "No task was attempted by every group: each group's curve is over its own tasks "
            "and the curves do not compare like with like."
        )
    if "human" in groups:
        for agent in (g for g in groups if g != "human"):
            try:
                report.crossovers.append(
                    stats.crossover(traj, "human", agent, n_boot=chosen.n_boot, level=chosen.level)
                )
            except ValueError as exc:
                report.notes.append(f"No crossover of human and {agent}: {exc}.")
    return report


def figures(report: Report, names: tuple[str, ...] = FIGURES) -> dict[str, go.Figure]:
    """The named figures of a report (an empty study gives no figures, not empty axes)."""
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure {unknown[0]!r}; choose from {', '.join(FIGURES)}")
    if report.traj.empty:
        return {}
    syn = report.data.synthetic
    traj, curves, level = report.traj, report.curves, report.filters.level
    checkpoint = report.filters.checkpoint or max(traj["checkpoint_hours"])
    # "last" is each attempt's final score: at the last checkpoint alone, attempts that ended
    # early (carry-forward off) would vanish from the bars ("0 tasks").
    at = traj if report.filters.checkpoint is not None else final_scores(traj, checkpoint)
    when = None if report.filters.checkpoint is not None else "at each attempt's last score"
    rate = (
        report.filters.hourly_rate
        if report.filters.hourly_rate is not None
        else report.data.human_hourly_rate_usd
    )
    out: dict[str, go.Figure] = {}
    for name in names:
        if name == "trajectories":
            out[name] = plots.trajectories_figure(traj, curves, synthetic=syn, level=level)
        elif name == "tasks":
            out[name] = plots.task_multiples_figure(traj, synthetic=syn)
        elif name == "best_of_k":
            bok = stats.best_of_k(traj, BEST_OF_K, level=level)
            out[name] = plots.best_of_k_figure(bok, synthetic=syn, level=level)
        elif name == "cost":
            cost = stats.score_vs_cost(traj, curves, rate)
            out[name] = plots.cost_figure(cost, synthetic=syn, hourly_rate=rate, level=level)
        elif name in ("categories", "stages"):
            prefix = "cat:" if name == "categories" else "stage:"
            table = stats.breakdown(at, prefix, level=level)
            what = "rubric category" if name == "categories" else "stage"
            out[name] = plots.breakdown_figure(
                table, synthetic=syn, checkpoint=checkpoint, what=what, level=level, when=when
            )
        elif name == "failures":
            out[name] = plots.failure_figure(stats.failure_classes(traj), synthetic=syn)
        elif name == "agreement":
            agreement = report.data.agreement
            if report.filters.tasks and len(agreement):
                agreement = agreement[agreement["task"].isin(report.filters.tasks)]
            out[name] = plots.agreement_figure(agreement, synthetic=syn)
    return out


def final_scores(traj: pd.DataFrame, checkpoint: float) -> pd.DataFrame:
    """Each attempt's last point with a score, placed at `checkpoint` (the breakdown's "last")."""
    scored = traj[traj["value"].notna()].sort_values(["attempt_id", "checkpoint_hours"])
    last = scored.groupby("attempt_id", sort=True).tail(1).copy()
    last["checkpoint_hours"] = checkpoint
    return last


def summary(report: Report, name: str) -> pd.DataFrame:
    """A statistics table of the report, each row carrying its method, level and counts.

    ``curves``: group means and intervals per checkpoint; ``best_of_k``: expected best of k
    runs with intervals (k beyond the data left empty and flagged); ``crossover``: the paired
    difference at each checkpoint of every human-agent comparison, with the crossover estimate,
    its interval, the tasks compared and the note on the rows.
    """
    if name not in SUMMARIES:
        raise ValueError(f"unknown summary {name!r}; choose from {', '.join(SUMMARIES)}")
    if report.traj.empty:  # nothing scored: the table's header alone
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS[name]))
    level = report.filters.level
    if name == "curves":
        return report.curves
    if name == "best_of_k":
        return stats.best_of_k(report.traj, BEST_OF_K, level=level)
    rows = []
    for c in report.crossovers:
        for point in c.paired:
            rows.append(
                {
                    "early_leader": c.early_leader,
                    "late_leader": c.late_leader,
                    "checkpoint_hours": point.hours,
                    "paired_difference": point.difference,
                    "lo": point.lo,
                    "hi": point.hi,
                    "n_tasks": point.n_tasks,
                    "n_attempts_early": c.attempts[c.early_leader],
                    "n_attempts_late": c.attempts[c.late_leader],
                    "leader": point.leader,
                    "separated": point.separated,
                    "tie_tolerance": c.tie_tolerance,
                    "crossings": "; ".join(
                        f"{x.to_leader} overtakes {x.from_leader} at {x.estimate_hours:.3g} h "
                        f"[{x.ci_low_hours:.3g}, {x.ci_high_hours:.3g}]"
                        for x in c.crossings
                    ),
                    "crossover_hours": c.estimate_hours,
                    "crossover_lo_hours": c.ci_low_hours,
                    "crossover_hi_hours": c.ci_high_hours,
                    "first_separated_hours": c.first_separated_hours,
                    "tasks_compared": " ".join(c.tasks),
                    "level": c.level,
                    "method": point.method,
                    "note": c.note,
                }
            )
    return pd.DataFrame(rows, columns=list(CROSSOVER_COLUMNS))


def with_integer_ids(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its id columns as (nullable) integers: a column with a missing id is read
    as floats, and the exports wrote ``375.0`` where an analyst joins on ``375``."""
    out = frame.copy()
    for column in out.columns:
        name = str(column)
        if name != "id" and not name.endswith("_id"):
            continue
        if pd.api.types.is_integer_dtype(out[column]):
            continue  # already integers: kept as they are (so a table read back is equal)
        values = pd.to_numeric(out[column], errors="coerce")
        present = out[column].notna()
        if values[present].notna().all() and (values[present] % 1 == 0).all():
            out[column] = values.astype("int64" if present.all() else "Int64")
    return out


def csv_text(frame: pd.DataFrame) -> str:
    """A table as CSV, ids written as integers (see `with_integer_ids`)."""
    return str(with_integer_ids(frame).to_csv(index=False))


def export_frame(frame: pd.DataFrame, fmt: str, path: Path) -> None:
    """Write any table as csv, parquet or json (records, NaN as null). Ids are written as
    integers in the text formats; parquet keeps the table's own types, so a table read back
    (the remote loader reads the portal's parquet) equals the one written."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(EXPORT_FORMATS)}")
    if fmt == "csv":
        with_integer_ids(frame).to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        with_integer_ids(frame).to_json(path, orient="records", indent=1)


def chromium_path() -> str | None:
    """The Chrome kaleido should drive: $BROWSER_PATH, else Debian's chromium."""
    configured = os.environ.get("BROWSER_PATH")
    if configured:
        return configured
    for candidate in CHROMIUM:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


class _QuietTruncatedBrowserMessage(logging.Filter):
    """When Chromium closes its pipe in the middle of a message at the end of an export, the
    driver (choreographer) drops the partial message and logs it with a full traceback. The
    export succeeded; a traceback in the portal's log would send an operator hunting for a
    failure, so that one record is kept as a one-line warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("JSONError decoding message"):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_QUIET_TRUNCATED_BROWSER_MESSAGE = _QuietTruncatedBrowserMessage()


def _quiet_truncated_browser_messages() -> None:
    """Install the filter once kaleido has made its driver's loggers: a logger asked for by name
    before then would be a plain one, which the driver cannot use."""
    import kaleido  # noqa: F401  (imports the driver, choreographer)

    logging.getLogger("choreographer.channels.pipe").addFilter(_QUIET_TRUNCATED_BROWSER_MESSAGE)


def write_figure(fig: go.Figure, path: Path, width: int = 1100, height: int = 650) -> None:
    """HTML with plotly.js inlined (no CDN), or a static PNG/SVG through kaleido and Chromium."""
    suffix = path.suffix.lower()
    if suffix == ".html":
        fig.write_html(path, include_plotlyjs=True, full_html=True)
        return
    if suffix not in IMAGE_SUFFIXES:
        raise ValueError(f"cannot write {path.name}: use .html, .png or .svg")
    browser = chromium_path()
    if browser is None:
        raise RuntimeError(
            "static export needs Chromium: apt-get install chromium, or set BROWSER_PATH"
        )
    if not os.access(browser, os.X_OK):
        raise RuntimeError(f"static export needs Chromium: {browser} is not an executable")
    _quiet_truncated_browser_messages()
    try:
        image = EXPORT_BROWSER.render(browser, fig.to_dict(), suffix[1:], width, height)
    except Exception as exc:  # kaleido's and its driver's errors; the browser is closed
        # The driver's errors carry several sentences as arguments: the first says it.
        text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise RuntimeError(f"static export through {browser} failed: {reason}") from exc
    path.write_bytes(image)
