"""`baseline export` and `baseline plot` against a synthetic study in a real database."""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from analysis import load_study
from analysis.seed import seed_synthetic_study
from analysis.table import COLUMNS
from baseline.context import Context
from tests.conftest import SeededStudy

NAME = "cli synthetic"

# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy(NAME, seed=3, fixture="seeded")


@pytest.fixture
def seeded(ctx: Context) -> Context:
    with ctx.session() as session:
        seed_synthetic_study(session, name=NAME, seed=3)
    return ctx


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(
    seeded: Context, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    """The CLI's own entry point, in this process (a subprocess costs seconds of imports)."""
    from baseline.cli import main

    monkeypatch.setenv("BASELINE_HOME", str(seeded.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", seeded.settings.database_url)
    monkeypatch.setenv("BASELINE_SECRET_KEY", "test")

    def invoke(*args: str, **env: str) -> Result:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_export_csv_json_parquet_match_the_table(
    seeded: Context, cli: Callable[..., Result], tmp_path: Path
) -> None:
    expected = load_study(NAME, context=seeded).table
    csv = cli("export", NAME, "--format", "csv")
    assert csv.returncode == 0, csv.stderr
    table = pd.read_csv(io.StringIO(csv.stdout))
    assert list(table.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert len(table) == len(expected)
    assert table["synthetic"].all()
    assert set(table["missing"].dropna()) >= {"ended_early", "not_graded"}

    out = tmp_path / "t.parquet"
    parquet = cli("export", NAME, "--format", "parquet", "--out", str(out))
    assert parquet.returncode == 0, parquet.stderr
    back = pd.read_parquet(out)
    assert len(back) == len(expected)
    pd.testing.assert_series_equal(back["score"], expected["score"], check_names=False)

    study_id = str(int(expected["study_id"].iloc[0]))
    js = cli("export", study_id, "--format", "json", "--out", str(tmp_path / "t.json"))
    assert js.returncode == 0, js.stderr
    records = json.loads((tmp_path / "t.json").read_text())
    assert len(records) == len(expected)


def test_export_summaries_name_their_method(cli: Callable[..., Result]) -> None:
    """Issue 13: exported statistics carry method, level and counts on every row."""
    from analysis.intervals import LOG_METHOD, MOVER_LOG_METHOD, SKEW_METHOD

    curves = cli("export", NAME, "--summary", "curves")
    assert curves.returncode == 0, curves.stderr
    table = pd.read_csv(io.StringIO(curves.stdout))
    assert LOG_METHOD in set(table["method"]) <= {LOG_METHOD, SKEW_METHOD}
    assert set(table["level"]) == {0.95}
    assert {"n_tasks", "n_attempts", "lo", "hi"} <= set(table.columns)
    crossover = cli("export", NAME, "--summary", "crossover", "--format", "json")
    assert crossover.returncode == 0, crossover.stderr
    rows = json.loads(crossover.stdout)
    assert rows and {"paired_difference", "lo", "hi", "n_tasks", "note"} <= set(rows[0])
    # scored tasks' normalised scores: MOVER from the groups' own intervals
    assert all(r["method"] == MOVER_LOG_METHOD for r in rows)
    bok = cli("export", NAME, "--summary", "best_of_k")
    table = pd.read_csv(io.StringIO(bok.stdout))
    human4 = table[(table["group"] == "human") & (table["k"] == 4)]
    assert human4["beyond_data"].all() and human4["expected_max"].isna().all()


def test_export_errors_are_one_line(cli: Callable[..., Result]) -> None:
    missing = cli("export", "no such study")
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("error:") and "no such study" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    binary = cli("export", NAME, "--format", "parquet")
    assert binary.returncode != 0 and "--out" in binary.stderr
    assert "Traceback" not in binary.stderr


@pytest.mark.sqlite_only("the image's size; the exports read the study on both databases")
def test_plot_png_has_requested_size(cli: Callable[..., Result], tmp_path: Path) -> None:
    out = tmp_path / "trajectories.png"
    result = cli(
        "plot",
        NAME,
        "--out",
        str(out),
        "--width",
        "900",
        "--height",
        "500",
        "--resamples",
        "200",
    )
    assert result.returncode == 0, result.stderr
    assert png_size(out) == (900, 500)
    assert out.stat().st_size > 20_000  # a drawn chart, not an empty canvas


@pytest.mark.sqlite_only("the HTML's content; the exports read the study on both databases")
def test_plot_html_is_self_contained_and_labelled(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    out = tmp_path / "all.html"
    result = cli("plot", NAME, "--out", str(out), "--resamples", "200")
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert "SYNTHETIC" in page and "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]+src=[\"']?https?:", page), "plotly.js must be inlined"
    assert page.count("Plotly.newPlot") == 8
    from analysis.intervals import METHOD

    captions = page.replace("\\u003cbr\\u003e", " ")  # figure captions, wrapped into lines
    assert f"Intervals: 95%, {METHOD}" in captions and "replicates: none" in page
    assert "human: 5 tasks, 15 attempts" in page


@pytest.mark.sqlite_only("the command line's error messages, not the storage")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "x.txt"], ".html, .png or .svg"),
        (["--out", "x.png", "--figure", "pie"], "choose from"),
        (["--out", "x.png", "--task", "ghost"], "no such task"),
        (["--out", "x.png", "--checkpoint", "3"], "not a checkpoint"),
    ],
)
def test_plot_errors_are_one_line(
    cli: Callable[..., Result], tmp_path: Path, args: list[str], message: str
) -> None:
    result = cli("plot", NAME, *[a.replace("x.", f"{tmp_path}/x.") for a in args])
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.sqlite_only("the message without Chromium, not the storage")
def test_plot_without_chromium_says_so(cli: Callable[..., Result], tmp_path: Path) -> None:
    result = cli(
        "plot",
        NAME,
        "--out",
        str(tmp_path / "x.png"),
        "--resamples",
        "100",
        BROWSER_PATH="/nonexistent/chromium",
    )
    assert result.returncode == 1
    assert "Chromium" in result.stderr and "Traceback" not in result.stderr


def test_plan_from_guesses_and_from_a_pilot(cli: Callable[..., Result], tmp_path: Path) -> None:
    stated = cli(
        "plan",
        "--checkpoint", "2:0.10:0.25",
        "--checkpoint", "8:0.45:0.30",
        "--task-sd", "1", "--attempt-sd", "0.5", "--attempts-b", "3", "--studies", "400",
        "--human-hourly-usd", "50", "--out", str(tmp_path / "power.html"),
    )  # fmt: skip
    assert stated.returncode == 0, stated.stderr
    assert re.search(r"2 h, gap \+0\.15: \d+ tasks \(power 0\.\d+ ± 0\.0\d+\)", stated.stdout)
    assert "human participants" in stated.stdout and "in all" in stated.stdout
    assert "Power to detect the gap" in (tmp_path / "power.html").read_text()
    piloted = cli(
        "plan", "--pilot", NAME, "--group-b", "iterative:model-a", "--studies", "300",
        "--checkpoint", "8:0:0", "--json",
    )  # fmt: skip
    assert piloted.returncode == 0, piloted.stderr
    plan = json.loads(piloted.stdout)
    assert [c["hours"] for c in plan["checkpoints"]] == [8.0]
    assert plan["spec"]["task_sd"] > 0


@pytest.mark.sqlite_only("the command line's error messages, not the storage")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--checkpoint", "2:0.2:0.3", "--task-sd", "1", "--attempt-sd", "1", "--power", "1"),
         "power must lie strictly between 0 and 1"),
        (("--checkpoint", "2:0.2:0.2", "--task-sd", "1", "--attempt-sd", "1"),
         "a gap of 0 cannot be detected"),
        (("--checkpoint", "2:0.2:0.3", "--attempt-sd", "1"), "give --task-sd"),
        (("--task-sd", "1", "--attempt-sd", "1"), "give --checkpoint"),
        (("--pilot", NAME, "--group-b", "ghost"), "no scores of group 'ghost'"),
    ],
)  # fmt: skip
def test_bad_plans_are_one_line_errors(
    cli: Callable[..., Result], args: tuple[str, ...], message: str
) -> None:
    result = cli("plan", *args)
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_best_of_k_with_nothing_scored_prints_its_header(
    cli: Callable[..., Result], seeded: Context
) -> None:
    """A study with nothing scored yet: the export printed an empty line, no header at all."""
    from analysis.stats import BEST_OF_K_COLUMNS
    from baseline.studies import studies

    with seeded.session() as session:
        studies.create_study(session, studies.StudySpec(name="nothing scored"), None)
    bok = cli("export", "nothing scored", "--summary", "best_of_k")
    assert bok.returncode == 0, bok.stderr
    assert bok.stdout.splitlines() == [",".join(BEST_OF_K_COLUMNS)]


@pytest.mark.sqlite_only("the summaries' headers, not the storage")
@pytest.mark.parametrize("summary", ["curves", "crossover"])
def test_empty_summaries_print_the_header_they_have_with_data(
    cli: Callable[..., Result], seeded: Context, summary: str
) -> None:
    """Nothing scored yet: curves and crossover printed an empty line, no header (only
    best_of_k had been mended); the header is now the one the same summary has with data."""
    from baseline.studies import studies

    full = cli("export", NAME, "--summary", summary)
    assert full.returncode == 0, full.stderr
    header = full.stdout.splitlines()[0]
    with seeded.session() as session:
        studies.create_study(session, studies.StudySpec(name="nothing scored"), None)
    empty = cli("export", "nothing scored", "--summary", summary)
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.splitlines() == [header]


def test_crossover_without_a_human_group_keeps_its_header(seeded: Context) -> None:
    """Scores, but no human to compare with: no crossover rows, the same columns."""
    from analysis import report

    data = load_study(NAME, context=seeded)
    full = report.summary(report.analyse(data, report.Filters(n_boot=100)), "crossover")
    agents = [g for g in data.groups if g != "human"]
    only_agents = report.analyse(data, report.Filters(groups=agents, n_boot=100))
    empty = report.summary(only_agents, "crossover")
    assert len(full) > 0 and empty.empty
    assert list(empty.columns) == list(full.columns)
    assert report.csv_text(empty).splitlines() == [",".join(full.columns)]
