"""Analysis commands: export a study's tidy table, and draw its figures to a file."""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from baseline.cli.paths import OutputFile
from baseline.cli.portal import client_for, portal_options
from baseline.context import Context

if TYPE_CHECKING:
    from analysis.report import Report
    from analysis.table import StudyData

FORMATS = ("csv", "parquet", "json")
SUMMARIES = ("curves", "best_of_k", "crossover")  # analysis.report.SUMMARIES, without importing it


def register(cli: click.Group) -> None:
    cli.add_command(export)
    cli.add_command(plot)


def load_study_data(
    study: str,
    hourly_rate: float | None = None,
    url: str | None = None,
    token: str | None = None,
    archive: Path | None = None,
) -> StudyData:
    """A study's data for the analysis commands (export, plot, plan's pilot): from this
    portal's database, from another portal over its API when `url` is given, or from a study
    archive alone (published-data mode: no database)."""
    from analysis import load_study

    if archive is not None:
        return _from_archive(study, archive, hourly_rate, url)
    if hourly_rate is not None and hourly_rate < 0:
        raise click.BadParameter("must be >= 0", param_hint="--hourly-rate")
    remote = client_for(url, token)
    if remote is not None:
        from analysis.remote import load_remote

        return load_remote(remote, study, hourly_rate)
    return load_study(study, context=Context.from_settings(), hourly_rate=hourly_rate)


def _from_archive(
    study: str, archive: Path, hourly_rate: float | None, url: str | None
) -> StudyData:
    from analysis.archive import load_archive

    if hourly_rate is not None:
        raise click.BadParameter(
            "an archive's table is priced as published", param_hint="--hourly-rate"
        )
    if url is not None:
        raise click.UsageError("--archive reads a file: give no --url")
    data = load_archive(archive)
    if study not in (data.name, str(data.study_id)):
        raise click.BadParameter(
            f"the archive holds study {data.study_id} {data.name!r}, not {study!r}",
            param_hint="STUDY",
        )
    return data


ARCHIVE_OPTION = click.option(
    "--archive",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read the study from this archive (`baseline study archive`), with no database.",
)


@click.command()
@click.argument("study")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="csv",
    show_default=True,
    help="The file format (the measurements, or the --summary table).",
)
@click.option(
    "--out",
    type=OutputFile(),
    help="File to write; csv and json go to stdout when omitted.",
)
@click.option("--hourly-rate", type=float, help="Human cost per working hour (default: study's).")
@click.option(
    "--summary",
    type=click.Choice(SUMMARIES),
    help="Export this statistics table instead of the measurements: group curves, best of k, "
    "or the crossover's paired differences; every row names its interval method, level and "
    "number of tasks.",
)
@portal_options
@ARCHIVE_OPTION
def export(
    study: str,
    fmt: str,
    out: Path | None,
    hourly_rate: float | None,
    summary: str | None,
    url: str | None,
    token: str | None,
    archive: Path | None,
) -> None:
    """Export the tidy results table of STUDY (a name or an id)."""
    from analysis import report

    if out is None and fmt == "parquet":
        raise click.UsageError("parquet is binary: give --out FILE")
    data = load_study_data(study, hourly_rate, url, token, archive)
    frame = data.table
    if summary is not None:
        try:
            frame = report.summary(report.analyse(data, report.Filters()), summary)
        except ValueError as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from exc
    if out is None:
        text = (
            report.csv_text(frame)
            if fmt == "csv"
            else report.with_integer_ids(frame).to_json(orient="records", indent=1)
        )
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    report.export_frame(frame, fmt, out)
    click.echo(f"wrote {len(frame)} rows of {data.name!r} to {out}", err=True)


@click.command()
@click.argument("study")
@click.option(
    "--out",
    required=True,
    type=OutputFile(),
    help="FILE.html (every figure, interactive) or FILE.png / FILE.svg (one figure).",
)
@click.option(
    "--figure",
    "figure_name",
    default="trajectories",
    show_default=True,
    help="For png/svg: trajectories, tasks, best_of_k, cost, categories, stages, "
    "failures or agreement.",
)
@click.option("--task", "tasks", multiple=True, help="Only this task (repeatable).")
@click.option("--group", "groups", multiple=True, help="Only this group (repeatable).")
@click.option("--checkpoint", type=float, help="Checkpoint (hours) of the breakdown bars.")
@click.option(
    "--carry-forward",
    is_flag=True,
    help="Carry an attempt's last score past its early end (the figure says so).",
)
@click.option(
    "--intervals",
    type=click.Choice(["auto", "anytime", "fixed"]),
    default="auto",
    show_default=True,
    help="Curves' intervals: anytime-valid confidence sequences (valid however often a running "
    "study is looked at), fixed-n (the final report's), or auto (anytime while attempts run).",
)
@click.option(
    "--own-tasks",
    is_flag=True,
    help="Draw each group's curve over its own tasks, not only the tasks every group attempted "
    "(the caption says so).",
)
@click.option(
    "--resamples",
    default=1000,
    show_default=True,
    type=click.IntRange(100, 20_000),
    help="Paired bootstrap replicates for a crossover's share of replicates crossing "
    "(intervals are t-intervals over tasks and need none).",
)
@click.option("--hourly-rate", type=float, help="Human cost per working hour (default: study's).")
@click.option(
    "--width",
    default=1100,
    show_default=True,
    type=click.IntRange(200, 5000),
    help="Pixels (PNG and SVG).",
)
@click.option(
    "--height",
    default=650,
    show_default=True,
    type=click.IntRange(200, 5000),
    help="Pixels (PNG and SVG).",
)
@ARCHIVE_OPTION
def plot(
    study: str,
    out: Path,
    figure_name: str,
    tasks: tuple[str, ...],
    groups: tuple[str, ...],
    checkpoint: float | None,
    carry_forward: bool,
    intervals: Literal["auto", "anytime", "fixed"],
    own_tasks: bool,
    resamples: int,
    hourly_rate: float | None,
    width: int,
    height: int,
    archive: Path | None,
) -> None:
    """Draw the figures of STUDY (a name or an id) into FILE.html, .png or .svg."""
    from analysis import report

    suffix = out.suffix.lower()
    if suffix not in (".html", *report.IMAGE_SUFFIXES):
        raise click.BadParameter("the file must end in .html, .png or .svg", param_hint="--out")
    if figure_name not in report.FIGURES:
        raise click.BadParameter(f"choose from {', '.join(report.FIGURES)}", param_hint="--figure")
    data = load_study_data(study, hourly_rate, archive=archive)
    try:
        filters = report.Filters(
            tasks=list(tasks),
            groups=list(groups),
            checkpoint=checkpoint,
            carry_forward=carry_forward,
            own_tasks=own_tasks,
            intervals=intervals,
            n_boot=resamples,
            hourly_rate=hourly_rate,
        )
        result = report.analyse(data, filters)
    except ValueError as exc:
        raise click.ClickException(str(exc).splitlines()[0]) from exc
    if result.traj.empty:
        raise click.ClickException(f"study {data.name!r} has no scored attempts to plot yet")
    if suffix == ".html":
        _write_html(result, out)
    else:
        figure = report.figures(result, (figure_name,))[figure_name]
        try:
            report.write_figure(figure, out, width=width, height=height)
        except RuntimeError as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from exc
    click.echo(f"wrote {out}", err=True)


def _write_html(result: Report, out: Path) -> None:
    """Every figure in one self-contained page (plotly.js inlined once, no CDN)."""
    import plotly.io as pio

    from analysis import report

    parts = []
    for index, fig in enumerate(report.figures(result).values()):
        parts.append(pio.to_html(fig, include_plotlyjs=index == 0, full_html=False))
    title = html.escape(("SYNTHETIC: " if result.data.synthetic else "") + result.data.name)
    out.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"</head><body><h1>{title}</h1>{''.join(parts)}</body></html>"
    )
