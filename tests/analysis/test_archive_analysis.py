"""From an archive alone: the figures and the report (published-data mode, no database), the
command line's archive, import and plot, and the agent runs as Inspect AI logs."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import select

from analysis import report
from analysis.archive import archive_study, load_archive
from analysis.inspect_logs import MISSING_PACKAGE, write_inspect_logs
from analysis.table import load_from_session
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.models import Attempt, ParticipantKind, Study
from tests.analysis import archive_world
from tests.analysis.archive_world import NAME, World


@dataclass
class Seeded:
    ctx: Context
    world: World
    archive: Path


@pytest.fixture
def seeded(ctx: Context, tmp_path: Path) -> Seeded:
    with ctx.session() as session:
        world = archive_world.build(session, store_for(ctx), tmp_path / "work")
        study = session.get(Study, world.study_id)
        assert study is not None
        archive_study(session, store_for(ctx), study, tmp_path / "study.tar")
    return Seeded(ctx, world, tmp_path / "study.tar")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    """The CLI's own entry point in this process, with the given home and database (or none)."""
    from baseline.cli import main

    def invoke(*args: str, home: Path, database_url: str | None = None) -> Result:
        monkeypatch.setenv("BASELINE_HOME", str(home))
        monkeypatch.setenv("BASELINE_SECRET_KEY", "test")
        if database_url is None:
            monkeypatch.delenv("BASELINE_DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("BASELINE_DATABASE_URL", database_url)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return invoke


def _no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach a database from here on fails the test."""

    def refuse(*_args: object, **_kwargs: object) -> Context:
        raise AssertionError("published-data mode opened a database")

    monkeypatch.setattr(Context, "from_settings", refuse)


@pytest.mark.sqlite_only("the archive is read without any database")
def test_figures_and_report_from_the_archive_alone(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    with seeded.ctx.session() as session:
        study = session.get(Study, seeded.world.study_id)
        assert study is not None
        original = load_from_session(session, study)
    _no_database(monkeypatch)
    published = load_archive(seeded.archive)
    pd.testing.assert_frame_equal(published.table, original.table, check_exact=True)
    pd.testing.assert_frame_equal(published.agreement, original.agreement, check_exact=True)
    assert (published.study_id, published.name, published.checkpoints, published.synthetic) == (
        original.study_id,
        original.name,
        original.checkpoints,
        original.synthetic,
    )
    ours, theirs = report.analyse(original), report.analyse(published)
    for name in report.SUMMARIES:
        pd.testing.assert_frame_equal(report.summary(theirs, name), report.summary(ours, name))
    mine, published_figures = report.figures(ours), report.figures(theirs)
    assert list(mine) == list(report.FIGURES)
    for name, figure in mine.items():
        assert published_figures[name].to_json() == figure.to_json(), name


@pytest.mark.sqlite_only("the command line's flow is the subject; the homes are incidental")
def test_cli_archives_imports_and_plots_without_a_database(
    seeded: Seeded,
    cli: Callable[..., Result],
    tmp_path: Path,
    migrated_sqlite: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = {"home": seeded.ctx.settings.home, "database_url": seeded.ctx.settings.database_url}
    out = tmp_path / "cli.tar.gz"
    made = cli("study", "archive", NAME, str(out), **source)
    assert made.returncode == 0, made.stderr
    assert "manifest_sha256: " in made.stdout
    from_database = cli("export", NAME, "--format", "csv", **source)

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copyfile(migrated_sqlite, fresh / "db.sqlite")
    target = {"home": fresh, "database_url": f"sqlite:///{fresh / 'db.sqlite'}"}
    imported = cli("study", "import-archive", str(out), **target)
    assert imported.returncode == 0, imported.stderr
    assert f"{NAME!r}" in imported.stdout
    not_one = tmp_path / "notes.txt"
    not_one.write_text("not an archive")
    bad = cli("study", "import-archive", str(not_one), **target)
    assert bad.returncode == 1 and bad.stderr == (  # one line, not tarfile's four tries
        f"error: {not_one}: not a study archive (not a tar file, compressed or not)\n"
    )
    again = cli("study", "import-archive", str(out), **target)
    assert again.returncode == 1
    assert again.stderr.startswith("error: archive ") and "imported already" in again.stderr

    nowhere = {"home": tmp_path / "no-home"}
    _no_database(monkeypatch)
    figure = tmp_path / "fig.html"
    plotted = cli("plot", NAME, "--archive", str(out), "--out", str(figure), **nowhere)
    assert plotted.returncode == 0, plotted.stderr
    assert figure.stat().st_size > 0
    published = cli("export", NAME, "--archive", str(out), "--format", "csv", **nowhere)
    assert published.returncode == 0 and published.stdout == from_database.stdout
    wrong = cli("plot", "other", "--archive", str(out), "--out", str(figure), **nowhere)
    assert (
        wrong.returncode == 2 and f"the archive holds study {seeded.world.study_id}" in wrong.stderr
    )

    tampered = tmp_path / "tampered.tar"
    archive_world.rewrite_member(seeded.archive, "tables/attempts.parquet", tampered)
    refused = cli("plot", NAME, "--archive", str(tampered), "--out", str(figure), **nowhere)
    assert refused.returncode == 1
    assert (
        refused.stderr.count("\n") == 1 and "tables/attempts.parquet was changed" in refused.stderr
    )


@pytest.mark.sqlite_only("the log format is the subject; the rows are read as the table reads them")
def test_inspect_logs_list_every_agent_attempt_and_tool_call(
    seeded: Seeded, tmp_path: Path
) -> None:
    from inspect_ai.log import EvalSample, read_eval_log
    from inspect_ai.model import ChatMessageAssistant, ChatMessageTool

    with seeded.ctx.session() as session:
        study = session.get(Study, seeded.world.study_id)
        assert study is not None
        table = load_from_session(session, study).table
        agents = {
            a.id
            for a in session.scalars(select(Attempt).where(Attempt.study_id == study.id))
            if a.participant.kind is ParticipantKind.AGENT
        }
        paths = write_inspect_logs(session, study, tmp_path / "logs")
    samples: dict[int, EvalSample] = {}
    for path in paths:
        log = read_eval_log(str(path))
        assert log.status == "success" and log.samples is not None
        samples |= {int(s.id): s for s in log.samples}
    assert set(samples) == agents
    for attempt_id, call_ids in seeded.world.tool_call_ids.items():
        sample = samples[attempt_id]
        called = [
            c.id
            for m in sample.messages
            if isinstance(m, ChatMessageAssistant)
            for c in m.tool_calls or []
        ]
        answered = [m.tool_call_id for m in sample.messages if isinstance(m, ChatMessageTool)]
        assert called == call_ids and answered == call_ids
        assert all(
            c.function == "bash" and "command" in c.arguments
            for m in sample.messages
            if isinstance(m, ChatMessageAssistant)
            for c in m.tool_calls or []
        )
        usage = next(iter(sample.model_usage.values()))
        assert (usage.input_tokens, usage.output_tokens) == (1200, 300)
    for attempt_id, sample in samples.items():
        rows = table[(table["attempt_id"] == attempt_id) & table["checkpoint_hours"].notna()]
        usable = rows[rows["missing"].isna() & rows["score"].notna()]
        expected = {
            f"checkpoint_{h:g}h": s
            for h, s in zip(usable.checkpoint_hours, usable.score, strict=True)
        }
        got = {name: score.value for name, score in (sample.scores or {}).items()}
        assert got == expected
        assert len(got) + len(sample.metadata["missing_checkpoints"]) == len(rows)


def test_inspect_export_without_the_package_says_how_to_install_it(
    cli: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything is opened: no database is set up here at all."""
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # import fails as if not installed
    _no_database(monkeypatch)
    result = cli("study", "inspect-logs", NAME, str(tmp_path / "logs"), home=tmp_path / "none")
    assert result.returncode == 1
    assert result.stderr == f"error: {MISSING_PACKAGE}\n"
    assert not (tmp_path / "logs").exists()
