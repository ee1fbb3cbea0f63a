"""Time to serve the analysis page of a large study, against how it read the ledger and drew the
task panels before.

A synthetic RE-Bench-shaped study (`analysis.seed`, no file content) of ``--tasks`` tasks (default
20) with ``--humans`` humans and ``--agents`` agents per agent group (default 10 and 10) is seeded
in a temporary home, and ``/analysis/`` is served to an analyst through the Flask test client
(median of ``--repeats``, after one warm-up). Two of its parts are timed alone, each against the
way it was done before, in the same run:

- reading the study (`analysis.table.build_table`): the agents' API costs from three columns of
  the ledger, against loading every ledger row as an ORM object;
- the per-task panels (`analysis.plots.task_multiples_figure`): one trace of attempt lines per
  task and group, against one trace per attempt.

    .venv/bin/python benchmarks/bench_analysis_page.py [--tasks 20] [--humans 10] [--agents 10]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from sqlalchemy import select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PASSWORD = "benchmark-password-1"


def median_s(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up: imports, caches, the first query plans
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class LedgerRows:
    """The agents' costs as `analysis.table` read them before: every ledger row an ORM object."""

    def __init__(self, session: Session, attempt_ids: list[int]) -> None:
        from baseline.models import ModelCall

        self._calls: dict[int, list[tuple[datetime, float]]] = defaultdict(list)
        rows = session.scalars(select(ModelCall).where(ModelCall.attempt_id.in_(attempt_ids)))
        for call in rows:
            if call.attempt_id is not None and call.grading_id is None:
                self._calls[call.attempt_id].append((call.created_at, call.cost_usd))
        for calls in self._calls.values():
            calls.sort(key=lambda r: r[0])

    def until(self, attempt_id: int, at: datetime | None) -> float:
        calls = self._calls.get(attempt_id, [])
        return sum(cost for when, cost in calls if at is None or when <= at)


def trace_per_attempt(traj: pd.DataFrame) -> go.Figure:
    """The per-task panels as they were drawn before: a trace for every attempt."""
    from analysis.plots import _rgba, group_colours

    tasks = sorted(traj["task"].unique())
    cols = min(3, max(1, len(tasks)))
    fig = make_subplots(rows=max(1, -(-len(tasks) // cols)), cols=cols, subplot_titles=tasks)
    for i, task in enumerate(tasks):
        r, c = i // cols + 1, i % cols + 1
        for group, colour in group_colours(sorted(traj["group"].unique())).items():
            rows = traj[(traj["task"] == task) & (traj["group"] == group)]
            for _, attempt in rows.groupby("attempt_id"):
                line = {"color": _rgba(colour, 0.3), "width": 1}
                fig.add_trace(
                    go.Scatter(
                        x=attempt["checkpoint_hours"], y=attempt["value"], mode="lines", line=line
                    ),
                    row=r,
                    col=c,
                )
            mean = rows.groupby("checkpoint_hours")["value"].mean()
            fig.add_trace(go.Scatter(x=mean.index, y=mean.to_numpy()), row=r, col=c)
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--humans", type=int, default=10)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as home:
        os.environ["BASELINE_HOME"] = home
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """Seed the study in $BASELINE_HOME, time its parts and its page, and print them."""
    import analysis.seed as seed
    import analysis.table as table
    from analysis import plots, report
    from analysis.synthetic import SyntheticSpec
    from app import create_app
    from baseline import migrate
    from baseline.config import load_settings
    from baseline.context import Context
    from baseline.models import Attempt, ModelCall, Role, Study
    from baseline.people import accounts

    specs = seed._specs

    def larger(at_seed: int) -> list[SyntheticSpec]:
        scored, *rest = specs(at_seed)
        return [scored.model_copy(update={"n_tasks": args.tasks}), *rest]

    rebench = seed.re_bench_spec
    setattr(seed, "_specs", larger)  # noqa: B010 (the demo's study, made larger)
    setattr(  # noqa: B010
        seed,
        "re_bench_spec",
        lambda **kw: rebench(**{**kw, "humans": args.humans, "agents": args.agents}),
    )
    settings = load_settings()
    migrate.upgrade(settings.database_url)
    ctx = Context.from_settings(settings)
    with ctx.session() as session:
        accounts.create_user(session, "analyst@bench.example", "Analyst", PASSWORD, Role.ANALYST)
        study_id = seed.seed_synthetic_study(session).id
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        attempts = session.scalars(select(Attempt.id).where(Attempt.study_id == study_id)).all()
        calls = len(session.scalars(select(ModelCall.id)).all())
        print(
            f"study: {args.tasks} tasks, {len(attempts)} attempts, {calls} ledger rows "
            f"(humans {args.humans}, agents {args.agents} per group)"
        )

        def read_study() -> object:
            return table.build_table(session, study)

        now_read = median_s(read_study, args.repeats)
        columns = table._Costs
        table._Costs = LedgerRows  # type: ignore[assignment,misc]
        try:
            before_read = median_s(read_study, args.repeats)
        finally:
            table._Costs = columns  # type: ignore[misc]
        data = table.load_from_session(session, study)
    result = report.analyse(data, report.Filters())
    traj: Any = result.traj
    now_panels = median_s(lambda: plots.task_multiples_figure(traj, synthetic=True), args.repeats)
    before_panels = median_s(lambda: trace_per_attempt(traj), args.repeats)

    app = create_app(context=ctx)
    app.config.update(TESTING=True)
    client = app.test_client()
    form = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert token is not None
    login = {"email": "analyst@bench.example", "password": PASSWORD, "csrf_token": token[1]}
    assert client.post("/login", data=login).status_code == 302

    def page() -> None:
        answer = client.get(f"/analysis/?study={study_id}")
        assert answer.status_code == 200, answer.status_code

    served = median_s(page, args.repeats)
    print(f"{'part':34s} {'now':>8s} {'before':>8s} {'ratio':>7s}")
    for name, now, before in (
        ("reading the study", now_read, before_read),
        ("per-task panels", now_panels, before_panels),
    ):
        print(f"{name:34s} {now:7.2f}s {before:7.2f}s {before / now:6.1f}x")
    print(f"{'the whole page, now':34s} {served:7.2f}s")
    ctx.engine.dispose()


if __name__ == "__main__":
    main()
