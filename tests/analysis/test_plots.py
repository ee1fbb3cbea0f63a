"""Figures: the expected traces, the SYNTHETIC label, and a PNG of the right size."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from analysis import plots, report
from analysis.synthetic import re_bench_spec, synthetic_table
from tests.analysis.browser import require_chromium

GROUPS = ("human", "iterative:model-a")


@pytest.fixture(scope="module")
def result() -> report.Report:
    data = synthetic_table(re_bench_spec(seed=8, task_kind="paper", p_ended_early=0.2))
    return report.analyse(data, report.Filters(n_boot=300))


def test_trajectory_figure_has_attempt_lines_bands_and_means(result: report.Report) -> None:
    fig = report.figures(result, ("trajectories",))["trajectories"]
    names = [trace.name for trace in fig.data]
    for group in GROUPS:
        assert f"{group} attempts" in names
        assert f"{group} 95% interval" in names
        assert f"{group} mean" in names
    mean = next(t for t in fig.data if t.name == "human mean")
    assert list(mean.x) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert fig.layout.title.text.startswith("SYNTHETIC")
    texts = [a.text.replace("<br>", " ") for a in fig.layout.annotations]
    assert "SYNTHETIC" in texts
    assert any("Missing (excluded, not 0): ended_early" in t for t in texts)
    assert fig.layout.xaxis.type == "log"


def test_each_task_panel_draws_a_groups_attempts_as_one_line_trace(result: report.Report) -> None:
    """A trace per attempt made a study of 20 tasks and 20 participants a figure of over a
    thousand traces; each panel now has one trace of attempt lines per group, every attempt's
    points in it, a gap (None) between attempts and where a checkpoint has no score."""
    traj = result.traj
    fig = report.figures(result, ("tasks",))["tasks"]
    tasks = sorted(traj["task"].unique())
    lines = [t for t in fig.data if t.name.endswith(" attempts")]
    assert len(lines) == len(traj.groupby(["task", "group"]))
    for trace in lines:
        group = trace.name.removesuffix(" attempts")
        axis = trace.xaxis.removeprefix("x")
        task = tasks[int(axis or 1) - 1]
        rows = traj[(traj["task"] == task) & (traj["group"] == group)]
        attempts = rows.sort_values(["attempt_id", "checkpoint_hours"]).groupby("attempt_id")
        xs: list[float | None] = []
        ys: list[float | None] = []
        for _, attempt in attempts:
            xs += [*attempt["checkpoint_hours"], None]
            ys += [None if v != v else v for v in attempt["value"]] + [None]
        assert list(trace.x) == xs and list(trace.y) == ys, (task, group)
        assert trace.connectgaps is False
    # The legend names each group's attempt lines once.
    assert sorted(t.name for t in lines if t.showlegend) == sorted(
        f"{group} attempts" for group in traj["group"].unique()
    )


def test_every_figure_is_built_and_labelled(result: report.Report) -> None:
    figures = report.figures(result)
    assert set(figures) == set(report.FIGURES)
    for name, fig in figures.items():
        assert fig.layout.title.text.startswith("SYNTHETIC"), name
        assert len(fig.data) > 0, name
        # Captions are wrapped: plotly does not wrap an annotation, and a long line ran off the
        # figure's right edge (the intervals' method sentence, seen in a screenshot).
        for annotation in fig.layout.annotations:
            lines = annotation.text.split("<br>")
            assert all(len(line) <= plots.CAPTION_LINE_CHARS for line in lines), (name, lines)
    assert len(figures["categories"].data) == 2  # one bar trace per group
    assert set(figures["categories"].data[0].x) == {
        "Code Development",
        "Code Execution",
        "Result Analysis",
    }


def test_carried_forward_is_stated(result: report.Report) -> None:
    carried = report.analyse(result.data, report.Filters(n_boot=200, carry_forward=True))
    fig = report.figures(carried, ("trajectories",))["trajectories"]
    assert any("Carried forward" in a.text.replace("<br>", " ") for a in fig.layout.annotations)


def test_real_data_is_not_labelled_synthetic(result: report.Report) -> None:
    data = result.data
    real = report.analyse(
        type(data)(**{**data.__dict__, "synthetic": False}), report.Filters(n_boot=200)
    )
    fig = report.figures(real, ("trajectories",))["trajectories"]
    assert not fig.layout.title.text.startswith("SYNTHETIC")
    assert "SYNTHETIC" not in [a.text for a in fig.layout.annotations]


def test_filters_narrow_and_reject_unknowns(result: report.Report) -> None:
    one = report.analyse(result.data, report.Filters(tasks=["synthetic-task-1"], n_boot=200))
    assert set(one.traj["task"]) == {"synthetic-task-1"}
    with pytest.raises(ValueError, match="no such group"):
        report.analyse(result.data, report.Filters(groups=["ghost"]))


@pytest.mark.browser
def test_png_export_has_size_and_traces(
    result: report.Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROWSER_PATH", require_chromium())
    fig = report.figures(result, ("trajectories",))["trajectories"]
    out = tmp_path / "t.png"
    report.write_figure(fig, out, width=800, height=480)
    header = out.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (800, 480)
    from PIL import Image

    with Image.open(out) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000) or []
    # the human mean line (#1f77b4) and the agent mean line (#ff7f0e, never red) are drawn
    drawn = {rgb for _, rgb in colours}
    assert (31, 119, 180) in drawn and (255, 127, 14) in drawn
    assert len(fig.data) >= 6


def test_svg_export_and_bad_suffix(result: report.Report, tmp_path: Path) -> None:
    fig = report.figures(result, ("cost",))["cost"]
    report.write_figure(fig, tmp_path / "c.html")
    assert "Plotly.newPlot" in (tmp_path / "c.html").read_text()
    with pytest.raises(ValueError, match=r"use \.html, \.png or \.svg"):
        report.write_figure(fig, tmp_path / "c.gif")


def test_a_static_export_s_failure_is_one_sentence_naming_the_browser(
    result: report.Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's errors carry several sentences; the first is reported, with the browser
    named, and nothing is written."""
    fig = report.figures(result, ("cost",))["cost"]
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(browser))
    calls: list[str] = []

    class BrowserFailedError(Exception):  # the driver's errors are not RuntimeErrors
        pass

    def broken(used: str, *_: object) -> bytes:
        calls.append(used)
        raise BrowserFailedError("Chromium crashed")

    monkeypatch.setattr(report.EXPORT_BROWSER, "render", broken)
    with pytest.raises(RuntimeError, match="failed: Chromium crashed"):
        report.write_figure(fig, tmp_path / "crash.svg")
    assert len(calls) == 1
    assert not (tmp_path / "crash.svg").exists()


def test_a_truncated_browser_message_is_logged_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The export driver's "JSONError ... Ignoring" is one warning line, other errors untouched,
    and the driver's own logger (with its extra methods) is the one filtered."""
    report._quiet_truncated_browser_messages()
    pipe_log = logging.getLogger("choreographer.channels.pipe")
    with caplog.at_level(logging.DEBUG):
        for message in ("JSONError decoding message. Ignoring", "Error in trying to decode"):
            try:
                raise ValueError("partial message")
            except ValueError:
                pipe_log.exception(message)
    quiet, loud = caplog.records
    assert (quiet.levelname, quiet.exc_info) == ("WARNING", None)
    assert "Traceback" not in caplog.text.split("Error in trying")[0]
    assert loud.levelname == "ERROR" and loud.exc_info is not None
    assert hasattr(pipe_log, "debug2")


def _cost_rows(costs: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "group": ["agent"] * len(costs),
            "cost_usd": costs,
            "mean": [0.2 * (i + 1) for i in range(len(costs))],
            "lo": [0.1 * (i + 1) for i in range(len(costs))],
            "hi": [0.3 * (i + 1) for i in range(len(costs))],
            "checkpoint_hours": [2.0 * (i + 1) for i in range(len(costs))],
        }
    )


def _caption(fig: go.Figure) -> str:
    return " ".join(str(a.text) for a in fig.layout.annotations)


def test_a_cost_axis_with_free_points_starts_at_zero_and_says_when_nothing_cost_anything() -> None:
    """Costs are never negative: a linear axis (taken where some point is free) starts at $0,
    its points there uncut; a figure where every point is free (a column of points on the axis,
    which ran from -1 to 1) draws nothing and says why."""
    free = plots.cost_figure(_cost_rows([0.0, 0.0]), synthetic=False, hourly_rate=0.0)
    assert len(free.data) == 0 and "every point costs $0" in _caption(free)
    some = plots.cost_figure(_cost_rows([0.0, 1.5]), synthetic=False, hourly_rate=0.0)
    assert some.layout.xaxis.rangemode == "nonnegative"
    assert all(trace.cliponaxis is False for trace in some.data)
    assert "Some points cost $0" in _caption(some) and "every point" not in _caption(some)
    priced = plots.cost_figure(_cost_rows([0.5, 1.5]), synthetic=False, hourly_rate=0.0)
    assert priced.layout.xaxis.type == "log" and "$0" not in _caption(priced).split("hour")[-1]
