"""From a loaded study and a set of filters to the figures and files analysts ask for.

The portal dashboard, `baseline plot` and `baseline export` all go through here, so they agree.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from pydantic import BaseModel, Field

from analysis import plots, stats
from analysis.table import StudyData

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
IMAGE_SUFFIXES = (".png", ".svg")
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


class Filters(BaseModel):
    """What the analyst narrowed the study to; empty lists mean everything."""

    tasks: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    checkpoint: float | None = None  # the checkpoint the breakdown bars show
    carry_forward: bool = False
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
    curves = stats.group_curves(traj, n_boot=chosen.n_boot, level=chosen.level)
    report = Report(data, chosen, traj, curves)
    groups = sorted(traj["group"].unique())
    if "human" in groups:
        for agent in (g for g in groups if g != "human"):
            try:
                report.crossovers.append(
                    stats.crossover(traj, "human", agent, n_boot=chosen.n_boot, level=chosen.level)
                )
            except ValueError:
                continue  # the two groups share too few checkpoints to compare
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
            out[name] = plots.best_of_k_figure(stats.best_of_k(traj, [1, 2, 4]), synthetic=syn)
        elif name == "cost":
            cost = stats.score_vs_cost(traj, curves, rate)
            out[name] = plots.cost_figure(cost, synthetic=syn, hourly_rate=rate)
        elif name in ("categories", "stages"):
            prefix = "cat:" if name == "categories" else "stage:"
            table = stats.breakdown(traj, prefix, n_boot=report.filters.n_boot, level=level)
            what = "rubric category" if name == "categories" else "stage"
            out[name] = plots.breakdown_figure(
                table, synthetic=syn, checkpoint=checkpoint, what=what
            )
        elif name == "failures":
            out[name] = plots.failure_figure(stats.failure_classes(traj), synthetic=syn)
        elif name == "agreement":
            agreement = report.data.agreement
            if report.filters.tasks and len(agreement):
                agreement = agreement[agreement["task"].isin(report.filters.tasks)]
            out[name] = plots.agreement_figure(agreement, synthetic=syn)
    return out


def export_table(data: StudyData, fmt: str, path: Path) -> None:
    """Write the tidy table as csv, parquet or json (records, NaN as null)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(EXPORT_FORMATS)}")
    table = data.table
    if fmt == "csv":
        table.to_csv(path, index=False)
    elif fmt == "parquet":
        table.to_parquet(path, index=False)
    else:
        table.to_json(path, orient="records", indent=1)


def chromium_path() -> str | None:
    """The Chrome kaleido should drive: $BROWSER_PATH, else Debian's chromium."""
    configured = os.environ.get("BROWSER_PATH")
    if configured:
        return configured
    for candidate in CHROMIUM:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


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
    os.environ["BROWSER_PATH"] = browser
    try:
        fig.write_image(path, width=width, height=height)
    except RuntimeError as exc:
        reason = next((line for line in str(exc).splitlines() if line.strip()), "unknown error")
        raise RuntimeError(f"static export through {browser} failed: {reason.strip()}") from exc
