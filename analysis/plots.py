"""Plotly figures of a study: trajectories, per-task small multiples, cost, breakdowns, agreement.

Every builder takes already-computed tables (from `analysis.stats`) and returns a Figure, so the
portal, the CLI and notebooks draw the same thing. Figures of synthetic data carry a SYNTHETIC
title prefix and watermark; carried-forward values and missing points are stated in a caption,
never drawn as zeros.
"""

from __future__ import annotations

import math
import textwrap
from numbers import Real
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.intervals import METHOD, PAIRED_METHOD
from analysis.missing import PointState, reason_counts
from analysis.planner import Plan
from analysis.sequential import CS_DETAIL

# Group colours: twelve that tell apart, none of them red or green, which mean failure and
# success in every figure (a group drawn red read as "failing" beside a failure chart).
PALETTE = (
    "#1f77b4",  # blue: humans
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
    "#393b79",
    "#6b6ecf",
    "#e7ba52",
    "#3182bd",
)
SUCCESS_COLOUR = "#2ca02c"
# Failure classes: red first, then warm and dark shades; never green.
FAILURE_COLOURS = ("#d62728", "#ff9896", "#843c39", "#e6550d", "#7b4173", "#636363")
SUCCEEDED = "succeeded"
SYNTHETIC_LABEL = "SYNTHETIC"
NO_DATA = "No data yet, because"


def group_colours(groups: list[str]) -> dict[str, str]:
    """Humans always blue; agents in a fixed order after that (beyond twelve groups the colours
    repeat, so the legend names each trace)."""
    ordered = sorted(groups, key=lambda g: (g != "human", g))
    return {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(ordered)}


def failure_colours(classes: list[str]) -> dict[str, str]:
    """Green for reproductions that succeeded, red and warm shades for the failure classes."""
    failed = sorted(c for c in classes if c != SUCCEEDED)
    colours = {c: FAILURE_COLOURS[i % len(FAILURE_COLOURS)] for i, c in enumerate(failed)}
    return {SUCCEEDED: SUCCESS_COLOUR, **colours} if SUCCEEDED in classes else colours


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


CAPTION_LINE_PX = 16
CAPTION_BELOW_AXIS_PX = 62
# A caption line's length in characters: at 11 px it fits the plot area of a figure 1,000 px wide
# (plotly does not wrap annotations; a longer line ran off the figure's right edge).
CAPTION_LINE_CHARS = 150
NO_DATA_LINE_CHARS = 80  # the no-data message is larger (15 px) and centred


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks at 1, 2 and 5 times a power of ten covering [low, high] (both > 0).

    Plotly's own log ticks label the digits of a short range ("4 5 6 7 8 9 1 2 3"), which reads
    as nonsense; these are whole values written out ("0.5 1 2 5 10").
    """
    ticks: list[float] = []
    for power in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = float(f"{mantissa}e{power}")
            if low / 2.5 <= value <= high * 2.5:
                ticks.append(value)
    return ticks


def _readable_log_ticks(fig: go.Figure) -> None:
    """Written-out ticks on every log x axis, from the range of the plotted x values."""
    xs: list[float] = []
    for trace in fig.data:
        values = getattr(trace, "x", None)
        if values is None:
            continue
        numbers = [float(x) for x in list(values) if isinstance(x, Real)]
        xs += [x for x in numbers if math.isfinite(x) and x > 0]
    if not xs:
        return
    ticks = log_ticks(min(xs), max(xs))
    fig.update_xaxes(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], selector={"type": "log"})


def wrap_caption(caption: str) -> str:
    """The caption with each of its lines broken at spaces into CAPTION_LINE_CHARS pieces."""
    return "<br>".join(
        "<br>".join(textwrap.wrap(line, CAPTION_LINE_CHARS, break_long_words=False)) or line
        for line in caption.split("<br>")
    )


def category_labels(names: list[str]) -> tuple[list[str], int]:
    """Category tick labels broken into short lines, and the most lines one takes.

    Plotly rotates long category labels, and a rotated label ran into the caption in exported
    PNGs; broken labels stay level and their height is known, so the caption moves below them.
    """
    width = max(8, 96 // max(1, len(names)))
    wrapped = [
        "<br>".join(textwrap.wrap(n, width, break_on_hyphens=True)) or n for n in map(str, names)
    ]
    return wrapped, max((w.count("<br>") + 1 for w in wrapped), default=1)


def no_data(fig: go.Figure, reason: str) -> go.Figure:
    """Say in the plot why it is empty (bare axes from -1 to 4 read as a broken page)."""
    fig.add_annotation(
        text="<br>".join(textwrap.wrap(f"{NO_DATA} {reason}", NO_DATA_LINE_CHARS)),
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
        showarrow=False,
        font={"size": 15, "color": "#39414f"},
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def label(
    fig: go.Figure, title: str, synthetic: bool, caption: str = "", tick_lines: int = 1
) -> go.Figure:
    """Title, caption under the plot, and the SYNTHETIC watermark when the data are synthetic;
    `tick_lines` is how many lines the x tick labels take (the caption goes below them)."""
    full = f"{SYNTHETIC_LABEL}: {title}" if synthetic else title
    caption = wrap_caption(caption)
    lines = caption.count("<br>") + 1 if caption else 0
    below = CAPTION_BELOW_AXIS_PX + CAPTION_LINE_PX * (tick_lines - 1)
    fig.update_layout(
        title={"text": full},
        template="plotly_white",
        # Room below the axis title for the caption, however many lines it has.
        margin={"t": 70, "b": 80 + CAPTION_LINE_PX * (lines + tick_lines - 1)},
        legend={"groupclick": "togglegroup"},
    )
    _readable_log_ticks(fig)
    if caption:
        if fig.layout.height is None:
            fig.update_layout(height=460 + CAPTION_LINE_PX * lines)  # the plot keeps its height
        fig.add_annotation(
            text=caption,
            xref="paper",
            yref="paper",
            x=0,
            y=0,
            yshift=-below,  # pixels: below the tick labels and the axis title
            showarrow=False,
            align="left",
            xanchor="left",
            yanchor="top",
            font={"size": 11, "color": "#5d6678"},
        )
    if synthetic:
        fig.add_annotation(
            text=SYNTHETIC_LABEL,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"size": 64, "color": "rgba(192,57,43,0.12)"},
            textangle=-20,
        )
    return fig


def interval_caption(level: float) -> str:
    """The sentence every figure with intervals carries: method, level and replicates."""
    return (
        f"Intervals: {level:.0%}, {METHOD}; df = tasks - 1; replicates: none "
        "(no resampling, so no Monte Carlo error)."
    )


def anytime_caption(level: float) -> str:
    """The sentence a live study's curves carry: their intervals hold however often they are
    looked at, and the final report's fixed-n intervals are not these."""
    return (
        f"Intervals: {level:.0%} {CS_DETAIL}. Wider than the final report's fixed-n intervals, "
        "which hold for one look only."
    )


def sizes_caption(traj: pd.DataFrame) -> str:
    used = traj[traj["value"].notna()]
    parts = [
        f"{group}: {sub['task'].nunique()} tasks, {sub['attempt_id'].nunique()} attempts"
        for group, sub in used.groupby("group")
    ]
    return "; ".join(parts) + "." if parts else "No scored attempt yet."


def gap_hours(curves: pd.DataFrame) -> dict[str, list[float]]:
    """Per group, checkpoints where it has no mean while another group has one."""
    if curves.empty:
        return {}
    any_data = curves.groupby("checkpoint_hours")["mean"].apply(lambda m: m.notna().any())
    out: dict[str, list[float]] = {}
    for group, rows in curves.groupby("group"):
        missing = rows[rows["mean"].isna() & rows["checkpoint_hours"].map(any_data)]
        if len(missing):
            out[str(group)] = sorted(float(h) for h in missing["checkpoint_hours"])
    return out


def _basis_caption(traj: pd.DataFrame, curves: pd.DataFrame) -> str:
    """Which tasks each group's mean is over, and which attempts' lines it leaves out."""
    used = traj[traj["value"].notna()]
    every = sorted(used["task"].unique())
    if curves.empty or "tasks_basis" not in curves.columns or used["group"].nunique() < 2:
        return "Group mean over tasks (tasks weigh the same)."
    if curves["tasks_basis"].iloc[0] == "own":
        return (
            "Each group's mean over its own tasks (tasks weigh the same): groups that attempted "
            "different tasks are not compared like with like."
        )
    shared = set(every)
    for _, rows in used.groupby("group"):
        shared &= set(rows["task"])
    left = [
        f"{group} {', '.join(sorted(set(rows['task']) - shared))}"
        for group, rows in used.groupby("group")
        if set(rows["task"]) - shared
    ]
    text = f"Group means over the {len(shared)} tasks every group attempted (tasks weigh the same)"
    if left:
        text += "; left out of the means, drawn as thin lines only: " + "; ".join(left)
    return text + "."


def _method_caption(traj: pd.DataFrame, curves: pd.DataFrame, level: float) -> str:
    counts = reason_counts(traj.loc[traj["value"].isna(), "missing"].tolist())
    carried = int((traj["state"] == PointState.CARRIED_FORWARD.value).sum())
    best = int((traj["state"] == PointState.BEST_SO_FAR.value).sum())
    anytime = "interval" in curves.columns and bool((curves["interval"] == "anytime").any())
    intervals = anytime_caption(level) if anytime else interval_caption(level)
    parts = [f"{_basis_caption(traj, curves)} {intervals}", sizes_caption(traj)]
    gaps = gap_hours(curves)
    if gaps:
        parts.append(
            "No data (line broken, not interpolated): "
            + "; ".join(f"{g} at {', '.join(f'{h:g} h' for h in hs)}" for g, hs in gaps.items())
            + "."
        )
    if best:
        parts.append(f"Scored tasks: best score logged by each checkpoint ({best} points).")
    floors = (
        reason_counts(traj.loc[traj["value"].notna(), "floor"].tolist())
        if "floor" in traj.columns
        else {}
    )
    if floors:
        parts.append(
            "At the floor (the submission failed its scoring: a result, scored 0): "
            + ", ".join(f"{k} {v}" for k, v in floors.items())
            + "."
        )
    parts.append(
        "Missing (excluded, not 0): "
        + (", ".join(f"{k} {v}" for k, v in counts.items()) if counts else "none")
        + "."
    )
    if carried:
        parts.append(f"Carried forward after the attempt ended: {carried} points.")
    return "<br>".join(parts)


UNSCORED = (
    "no checkpoint has a score: snapshots are still to be reproduced and graded (paper tasks "
    "need the study's judge set), or every attempt ended before its first checkpoint."
)


def trajectories_figure(
    traj: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    synthetic: bool,
    title: str = "Score against working time",
    level: float = 0.95,
) -> go.Figure:
    """Thin per-attempt lines, group means with interval bands, failed reproductions marked."""
    fig = go.Figure()
    colours = group_colours(sorted(traj["group"].unique()))
    for group, colour in colours.items():
        rows = traj[traj["group"] == group]
        fig.add_trace(_attempt_lines(rows, group, colour))
        curve = curves[curves["group"] == group].sort_values("checkpoint_hours")
        if curve.empty:
            continue
        band_x, band_y = _band(curve)
        fig.add_trace(
            go.Scatter(
                x=band_x,
                y=band_y,
                mode="lines",
                fill="toself",
                fillcolor=_rgba(colour, 0.18),
                line={"width": 0},
                name=f"{group} {level:.0%} interval",
                legendgroup=group,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=curve["checkpoint_hours"],
                y=curve["mean"],
                mode="lines+markers",
                name=f"{group} mean",
                legendgroup=group,
                line={"color": colour, "width": 3},
                connectgaps=False,
                customdata=curve[
                    ["lo", "hi", "n_tasks", "n_attempts", "n_missing", "n_floor"]
                ].to_numpy(),
                hovertemplate=(
                    "%{x} h: %{y:.3f} [%{customdata[0]:.3f}, %{customdata[1]:.3f}]"
                    "<br>%{customdata[2]} tasks, %{customdata[3]} attempts (%{customdata[5]} at "
                    "the floor), missing %{customdata[4]}<extra>" + group + "</extra>"
                ),
            )
        )
        gaps = gap_hours(curves).get(group, [])
        if gaps:
            fig.add_trace(
                go.Scatter(
                    x=gaps,
                    y=[0.0] * len(gaps),
                    mode="markers+text",
                    name=f"{group}: no data",
                    legendgroup=group,
                    marker={"symbol": "x-thin-open", "size": 14, "color": colour},
                    text=["no data"] * len(gaps),
                    textposition="top center",
                    hovertemplate="%{x} h: no data for " + group + "<extra></extra>",
                )
            )
        failed = rows[rows["reproduction_failed"].astype(bool) & rows["value"].notna()]
        if len(failed):
            fig.add_trace(
                go.Scatter(
                    x=failed["checkpoint_hours"],
                    y=failed["value"],
                    mode="markers",
                    name=f"{group} failed reproduction",
                    legendgroup=group,
                    marker={"symbol": "x", "size": 5, "color": colour, "opacity": 0.6},
                    text=failed["failure_class"].fillna("unclassified"),
                    hovertemplate="%{text}<extra>failed reproduction</extra>",
                )
            )
    fig.update_xaxes(type="log", title="working hours (log scale)")
    fig.update_yaxes(title="score")
    if not traj["value"].notna().any():
        no_data(fig, UNSCORED)
    return label(fig, title, synthetic, _method_caption(traj, curves, level))


def _attempt_lines(
    rows: pd.DataFrame, group: str, colour: str, *, showlegend: bool = True
) -> go.Scatter:
    """Every attempt's line in `rows` (a group's) as one thin trace, None between attempts and
    for a checkpoint without a score: a trace per attempt made a study of 20 tasks and 20
    participants a figure of over a thousand traces, slow to build and slow to draw."""
    xs: list[Any] = []
    ys: list[Any] = []
    ordered = rows.sort_values(["attempt_id", "checkpoint_hours"])
    columns = (ordered[name].tolist() for name in ("attempt_id", "checkpoint_hours", "value"))
    previous = None
    for attempt, hours, value in zip(*columns, strict=True):
        if previous is not None and attempt != previous:
            xs.append(None)
            ys.append(None)
        xs.append(hours)
        ys.append(None if math.isnan(value) else value)
        previous = attempt
    if previous is not None:
        xs.append(None)
        ys.append(None)
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        name=f"{group} attempts",
        legendgroup=group,
        showlegend=showlegend,
        line={"color": _rgba(colour, 0.3), "width": 1},
        hoverinfo="skip",
        connectgaps=False,
    )


def _band(curve: pd.DataFrame) -> tuple[list[Any], list[Any]]:
    """Closed polygons of the interval band, one per run of checkpoints with an interval, so a
    checkpoint without one breaks the band instead of being bridged."""
    xs: list[Any] = []
    ys: list[Any] = []
    run: list[tuple[float, float, float]] = []
    rows = list(zip(curve["checkpoint_hours"], curve["lo"], curve["hi"], strict=True))
    for h, lo, hi in [*rows, (math.nan, math.nan, math.nan)]:
        if not (math.isnan(lo) or math.isnan(hi)):
            run.append((h, lo, hi))
            continue
        if run:
            xs.extend([*[r[0] for r in run], *[r[0] for r in reversed(run)], None])
            ys.extend([*[r[2] for r in run], *[r[1] for r in reversed(run)], None])
            run = []
    return xs, ys


def task_multiples_figure(traj: pd.DataFrame, *, synthetic: bool) -> go.Figure:
    """One panel per task: attempt lines and each group's mean over that task's attempts."""
    tasks = sorted(traj["task"].unique())
    cols = min(3, max(1, len(tasks)))
    rows_n = max(1, math.ceil(len(tasks) / cols))
    fig = make_subplots(rows=rows_n, cols=cols, subplot_titles=tasks, shared_yaxes=False)
    colours = group_colours(sorted(traj["group"].unique()))
    named: set[str] = set()  # each group's entries go in the legend once, where it first appears
    panels = dict(iter(traj.groupby(["task", "group"], sort=False)))
    for i, task in enumerate(tasks):
        r, c = i // cols + 1, i % cols + 1
        for group, colour in colours.items():
            rows = panels.get((task, group))
            if rows is None or rows.empty:
                continue
            first = group not in named
            named.add(group)
            fig.add_trace(_attempt_lines(rows, group, colour, showlegend=first), row=r, col=c)
            mean = rows.groupby("checkpoint_hours")["value"].mean()
            fig.add_trace(
                go.Scatter(
                    x=mean.index,
                    y=mean.to_numpy(),
                    mode="lines+markers",
                    name=f"{group} mean",
                    legendgroup=group,
                    showlegend=first,
                    line={"color": colour, "width": 2},
                ),
                row=r,
                col=c,
            )
    fig.update_xaxes(type="log")
    fig.update_xaxes(title={"text": "working hours (log scale)", "font": {"size": 11}})
    fig.update_yaxes(title="score", col=1)
    fig.update_layout(height=300 * rows_n)
    if not traj["value"].notna().any():
        no_data(fig, UNSCORED)
    return label(fig, "Score against working time, per task (mean of attempts)", synthetic)


def cost_figure(
    cost: pd.DataFrame, *, synthetic: bool, hourly_rate: float, level: float = 0.95
) -> go.Figure:
    fig = go.Figure()
    colours = group_colours(sorted(cost["group"].unique()) if len(cost) else [])
    for group, colour in colours.items():
        rows = cost[cost["group"] == group].sort_values("cost_usd")
        fig.add_trace(
            go.Scatter(
                x=rows["cost_usd"],
                y=rows["mean"],
                mode="lines+markers+text",
                name=group,
                text=[f"{h:g}h" for h in rows["checkpoint_hours"]],
                textposition="top left",
                cliponaxis=False,  # $0 sits on the axis: its marker and label are not cut
                line={"color": colour},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": rows["hi"] - rows["mean"],
                    "arrayminus": rows["mean"] - rows["lo"],
                },
            )
        )
    drawn = cost[cost["mean"].notna()] if len(cost) else cost
    free = bool(len(drawn)) and bool((drawn["cost_usd"] <= 0).any())
    if free:  # a log axis cannot show $0, and its points would vanish without a word
        fig.update_xaxes(title="cost per attempt, USD", rangemode="nonnegative")
    else:
        fig.update_xaxes(type="log", title="cost per attempt, USD (log scale)")
    fig.update_yaxes(title="mean score")
    caption = (
        f"Humans at ${hourly_rate:,.0f} per working hour; agents: API calls in the ledger up to "
        f"each checkpoint.<br>{interval_caption(level)}"
    )
    if drawn.empty:
        no_data(fig, "no group has a mean score at any checkpoint yet. " + UNSCORED)
    elif bool((drawn["cost_usd"] <= 0).all()):  # a column of points on the axis says nothing
        fig.data = ()
        no_data(
            fig,
            "every point costs $0: no API call with a price was recorded, and humans are at $0 "
            "per working hour here.",
        )
    elif free:
        caption += "<br>Some points cost $0 (no API calls recorded), so the axis is linear."
    return label(fig, "Score against cost", synthetic, caption)


def breakdown_figure(
    breakdown: pd.DataFrame,
    *,
    synthetic: bool,
    checkpoint: float,
    what: str,
    level: float = 0.95,
    when: str | None = None,
) -> go.Figure:
    """Bars of each sub-score at one checkpoint, per group, with interval whiskers; `when` names
    the checkpoint in words where it is not one fixed time (each attempt's final score)."""
    fig = go.Figure()
    rows = breakdown[breakdown["checkpoint_hours"] == checkpoint] if len(breakdown) else breakdown
    colours = group_colours(sorted(rows["group"].unique()) if len(rows) else [])
    names = sorted(rows["name"].unique()) if len(rows) else []
    ticks, tick_lines = category_labels(names)
    tick = dict(zip(names, ticks, strict=True))
    for group, colour in colours.items():
        sub = rows[rows["group"] == group]
        fig.add_trace(
            go.Bar(
                x=[tick[n] for n in sub["name"]],
                y=sub["mean"],
                name=group,
                marker_color=colour,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": sub["hi"] - sub["mean"],
                    "arrayminus": sub["mean"] - sub["lo"],
                },
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickangle=0)
    fig.update_yaxes(title="mean sub-score")
    counts = (
        "; ".join(f"{g}: {int(n)} tasks" for g, n in rows.groupby("group")["n_tasks"].max().items())
        if len(rows)
        else ""
    )
    caption = f"{interval_caption(level)}<br>{counts}"
    at = f"at {checkpoint:g} working hours" if when is None else when
    if not len(rows):
        no_data(fig, f"no snapshot has {what} scores {at}. {UNSCORED}")
    return label(fig, f"Scores by {what} {at}", synthetic, caption, tick_lines)


def failure_figure(classes: pd.DataFrame, *, synthetic: bool) -> go.Figure:
    """Stacked shares of each group's reproductions: succeeded green, failure classes red."""
    fig = go.Figure()
    groups = sorted(classes["group"].unique()) if len(classes) else []
    ticks, tick_lines = category_labels(groups)
    tick = dict(zip(groups, ticks, strict=True))
    colours = failure_colours(list(classes["failure_class"].unique()) if len(classes) else [])
    for name, colour in colours.items():
        sub = classes[classes["failure_class"] == name]
        fig.add_trace(
            go.Bar(
                x=[tick[g] for g in sub["group"]],
                y=sub["share"],
                name=name,
                text=sub["count"],
                marker_color=colour,
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(tickangle=0)
    fig.update_yaxes(title="share of reproductions", tickformat=".0%")
    if not groups:
        no_data(fig, "no reproduction has run yet (paper tasks' snapshots are reproduced first).")
    return label(fig, "Reproductions by failure class", synthetic, tick_lines=tick_lines)


def agreement_figure(agreement: pd.DataFrame, *, synthetic: bool) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[0, 1],
            y=[0, 1],
            mode="lines",
            name="agreement",
            line={"dash": "dot", "color": "#888"},
            hoverinfo="skip",
        )
    )
    colours = group_colours(sorted(agreement["group"].unique()) if len(agreement) else [])
    for group, colour in colours.items():
        sub = agreement[agreement["group"] == group]
        fig.add_trace(
            go.Scatter(
                x=sub["expert_score"],
                y=sub["judge_score"],
                mode="markers",
                name=group,
                marker={"color": colour, "size": 9},
                customdata=sub[["leaf_agreement", "task"]],
                hovertemplate=(
                    "expert %{x:.2f}, judge %{y:.2f}<br>leaf agreement %{customdata[0]:.0%}"
                    "<br>%{customdata[1]}<extra></extra>"
                ),
            )
        )
    fig.update_xaxes(title="expert score", range=[0, 1])
    fig.update_yaxes(title="judge score", range=[0, 1])
    compared = agreement["leaves_compared"].sum() if len(agreement) else 0
    if not compared:
        no_data(fig, "no snapshot has both a judge grading and an expert grading with leaf grades.")
        return label(fig, "Judge against expert", synthetic)
    caption = (
        f"{len(agreement)} snapshots graded by both; leaf agreement "
        f"{(agreement['leaf_agreement'] * agreement['leaves_compared']).sum() / compared:.1%} "
        f"over {int(compared)} leaves."
    )
    return label(fig, "Judge against expert", synthetic, caption)


def best_of_k_figure(bok: pd.DataFrame, *, synthetic: bool, level: float = 0.95) -> go.Figure:
    """Expected best of k runs against total budget, with intervals; k beyond the data is
    absent (without replacement) or drawn hollow and named in the caption (with replacement)."""
    fig = go.Figure()
    colours = group_colours(sorted(bok["group"].unique()) if len(bok) else [])
    for group, colour in colours.items():
        for k, rows in bok[bok["group"] == group].groupby("k"):
            if not rows["expected_max"].notna().any():
                continue  # wholly beyond the data: the caption names it; no empty legend entry
            rows = rows.sort_values("budget_hours")
            marked = rows["beyond_data"].astype(bool)
            fig.add_trace(
                go.Scatter(
                    x=rows["budget_hours"],
                    y=rows["expected_max"],
                    mode="lines+markers",
                    name=f"{group} best of {k}",
                    line={"color": colour, "dash": _dash(int(k))},
                    marker={
                        "symbol": ["circle-open" if m else "circle" for m in marked],
                        "size": [11 if m else 7 for m in marked],
                    },
                    connectgaps=False,
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": rows["hi"] - rows["expected_max"],
                        "arrayminus": rows["expected_max"] - rows["lo"],
                        "thickness": 1,
                    },
                    customdata=rows[["lo", "hi", "n_tasks", "fewest_runs"]].to_numpy(),
                    hovertemplate=(
                        "budget %{x} h: %{y:.3f} [%{customdata[0]:.3f}, %{customdata[1]:.3f}]"
                        "<br>%{customdata[2]} tasks, fewest runs per task %{customdata[3]}"
                        f"<extra>{group} best of {k}</extra>"
                    ),
                )
            )
    fig.update_xaxes(type="log", title="total budget, hours (k runs x run length)")
    fig.update_yaxes(title="expected best score")
    if bok.empty or not bok["expected_max"].notna().any():
        no_data(fig, "no task has a scored run of any group at any run length yet.")
    return label(fig, "Best of k runs", synthetic, _best_of_k_caption(bok, level))


def _best_of_k_caption(bok: pd.DataFrame, level: float) -> str:
    if bok.empty:
        return ""
    parts = [
        f"Estimator: {bok['estimator'].iloc[0]}; averaged over tasks.",
        interval_caption(level),
    ]
    sizes = bok.groupby("group").agg(tasks=("n_tasks", "max"), fewest=("fewest_runs", "min"))
    parts.append(
        "; ".join(
            f"{g}: {int(r.tasks)} tasks, fewest runs per task {int(r.fewest)}"
            for g, r in sizes.iterrows()
        )
        + ". Every k of a curve uses the same tasks."
    )
    beyond = bok[bok["beyond_data"].astype(bool)]
    if len(beyond):
        shown = beyond["expected_max"].notna().any()
        what = "drawn hollow: beyond the data" if shown else "not shown: beyond the data"
        parts.append(
            f"k above a group's fewest runs per task at that run length {what} ("
            + "; ".join(_beyond(bok, str(g), rows) for g, rows in beyond.groupby("group"))
            + ")."
        )
    return "<br>".join(parts)


def _beyond(bok: pd.DataFrame, group: str, rows: pd.DataFrame) -> str:
    """'human k=4' when k is beyond the data at every run length, else the run lengths."""
    runs = set(bok.loc[bok["group"] == group, "run_hours"])
    parts = []
    for k, at in rows.groupby("k"):
        hours = sorted(set(at["run_hours"]))
        where = "" if set(hours) == runs else f" at {', '.join(f'{h:g}' for h in hours)} h runs"
        parts.append(f"k={k}{where}")
    return f"{group} {', '.join(parts)}"


def _dash(k: int) -> str:
    return ("solid", "dash", "dot", "dashdot")[min(3, max(0, int(math.log2(k))))]


def power_figure(result: Plan) -> go.Figure:
    """Power against the number of tasks, one curve per checkpoint, the target as a line."""
    fig = go.Figure()
    spec = result.spec
    for checkpoint in result.checkpoints:
        tasks = [n for n, _ in checkpoint.power_curve]
        power = [p for _, p in checkpoint.power_curve]
        fig.add_trace(
            go.Scatter(
                x=tasks,
                y=power,
                mode="lines+markers",
                name=f"{checkpoint.hours:g} h: gap {checkpoint.gap:+.3g}",
            )
        )
    fig.add_hline(y=spec.power, line_dash="dash", annotation_text=f"target {spec.power:.0%}")
    fig.update_layout(
        xaxis={"title": {"text": "tasks (each attempted by both groups)"}},
        yaxis={"title": {"text": "power"}, "range": [0, 1]},
    )
    caption = (
        f"Simulated: {spec.studies} studies per point, {spec.shape} scores, task sd "
        f"{spec.task_sd:g}, attempt sd {spec.attempt_sd:g}, {spec.attempts_a} attempts per task "
        f"for {spec.group_a} and {spec.attempts_b} for {spec.group_b}; a study detects the gap "
        f"when its {spec.level:.0%} paired interval ({PAIRED_METHOD}) excludes 0 on the gap's side."
    )
    return label(fig, "Power to detect the gap", False, caption)
