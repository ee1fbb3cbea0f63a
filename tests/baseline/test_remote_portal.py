"""The CLI and `analysis` act on a portal served over HTTP, with an API token.

The portal is served for real (werkzeug's threaded server on a loopback port) from the test's
database; commands get `--url`/`--token` or BASELINE_URL/BASELINE_TOKEN.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from flask import Flask
from sqlalchemy.orm import Session
from werkzeug.serving import make_server

from analysis import load_study
from analysis.seed import seed_synthetic_study
from baseline.attempts import attempts, clock, snapshots
from baseline.cli import cli
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus, Role, Task, TaskKind
from baseline.people import accounts
from baseline.studies import studies
from tests.conftest import Users


@dataclass
class Portal:
    url: str
    tokens: dict[Role, str]


@pytest.fixture
def portal(app: Flask, ctx: Context, users: Users) -> Iterator[Portal]:
    with ctx.session() as session:
        tokens = {
            role: accounts.issue_token(session, session.merge(users[role]), "remote")
            for role in Role
        }
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Portal(f"http://127.0.0.1:{server.server_port}", tokens)
    finally:
        server.shutdown()
        thread.join(timeout=10)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_analysis_loads_the_same_study_data_from_a_portal(ctx: Context, portal: Portal) -> None:
    with ctx.session() as session:
        study = seed_synthetic_study(session, name="remote study", seed=4)
        study_id = study.id
    local = load_study(study_id, context=ctx)
    remote = load_study("remote study", url=portal.url, token=portal.tokens[Role.ANALYST])
    assert remote.study_id == local.study_id and remote.name == local.name
    assert remote.checkpoints == local.checkpoints
    assert remote.human_hourly_rate_usd == local.human_hourly_rate_usd
    assert remote.synthetic is local.synthetic is True
    pd.testing.assert_frame_equal(remote.table, local.table, check_dtype=True)
    assert len(remote.agreement) == len(local.agreement)
    assert remote.groups == local.groups and remote.tasks == local.tasks

    repriced = load_study(
        study_id, url=portal.url, token=portal.tokens[Role.ANALYST], hourly_rate=10
    )
    local_repriced = load_study(study_id, context=ctx, hourly_rate=10)
    pd.testing.assert_series_equal(repriced.table["cost_usd"], local_repriced.table["cost_usd"])


def test_cli_acts_on_a_remote_portal(
    ctx: Context, portal: Portal, users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "main.py").write_text("print('hi')\n")

    def finder(_session: Session, _attempt: Attempt) -> snapshots.SubmissionSource:
        return snapshots.DirectorySource(str(folder))

    monkeypatch.setattr(snapshots, "_FINDERS", [finder])
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="CLI remote"), None)
        task = Task(slug="cli-remote", title="CLI", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        agent = studies.add_agent(session, study, "Agent", "basic", "m", "", {}, None)
        attempt_id = studies.create_attempt(session, agent, task, None).id
        study_id = study.id
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    token = portal.tokens[Role.COORDINATOR]

    code, out = _run("study", "list", "--url", portal.url, "--token", token)
    assert code == 0 and "CLI remote" in out
    env = {"BASELINE_URL": portal.url, "BASELINE_TOKEN": token}
    code, out = _run("attempt", "pause", str(attempt_id), "--note", "remote", env=env)
    assert code == 0 and "paused" in out
    with ctx.session() as session:
        paused = session.get(Attempt, attempt_id)
        assert paused is not None and paused.status is AttemptStatus.PAUSED
        used_h = clock.state(paused).working_s / 3600
    # The clock reads as the local command reads it (it had no --url: checking a remote pause
    # took the portal's page).
    code, out = _run("attempt", "clock", str(attempt_id), env=env)
    assert code == 0 and out.strip() == (
        f"attempt {attempt_id} [paused] paused (admin): {used_h:.3f} of 48 working hours used"
    )
    assert _run("attempt", "resume", str(attempt_id), env=env)[0] == 0
    # an extension asked from the limit it was is added once, over the portal too
    once = ("attempt", "extend", str(attempt_id), "--hours", "2", "--reason", "outage")
    code, out = _run(*once, "--if-limit-is", "48", env=env)
    assert code == 0 and "limit now 50 working hours" in out
    code, out = _run(*once, "--if-limit-is", "48", env=env)
    assert code != 0
    with ctx.session() as session:
        extended = session.get(Attempt, attempt_id)
        assert extended is not None and extended.working_time_limit_s == 50 * 3600
    code, out = _run("attempt", "submit", str(attempt_id), env=env)
    assert code == 0 and "final snapshot" in out
    with ctx.session() as session:
        row = session.get(Attempt, attempt_id)
        assert row is not None and row.status is AttemptStatus.SUBMITTED
        final_id = max(s.id for s in row.snapshots)
    # Disqualified after the fact (a breach found in review): it took the portal's machine.
    code, out = _run("attempt", "disqualify", str(attempt_id), "--reason", "copied", env=env)
    assert code == 0 and out.strip() == f"attempt {attempt_id} disqualified"
    with ctx.session() as session:
        row = session.get(Attempt, attempt_id)
        assert row is not None and row.status is AttemptStatus.DISQUALIFIED
        assert row.end_reason == "copied"
    out_file = tmp_path / "final.tar.gz"
    code, out = _run("snapshot", "export", str(final_id), "--out", str(out_file), env=env)
    assert code == 0 and out_file.stat().st_size > 0

    table = tmp_path / "table.parquet"
    code, out = _run("export", str(study_id), "--format", "parquet", "--out", str(table), env=env)
    assert code == 0, out
    assert set(pd.read_parquet(table)["attempt_id"].dropna()) == {attempt_id}

    participant = {"BASELINE_URL": portal.url, "BASELINE_TOKEN": portal.tokens[Role.PARTICIPANT]}
    code, out = _run("attempt", "pause", str(attempt_id), env=participant)
    assert code != 0  # CliRunner returns the exception; main() prints one line (below)
    code, out = _run("study", "list", "--url", portal.url, "--token", "wrong")
    assert code != 0


def test_remote_errors_are_one_line(portal: Portal, capsys: pytest.CaptureFixture[str]) -> None:
    from baseline.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["study", "list", "--url", portal.url, "--token", "wrong-token"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: portal answered 401") and "\n" not in err
    with pytest.raises(SystemExit):
        main(["study", "list", "--url", "http://127.0.0.1:9", "--token", "x"])
    assert "cannot reach the portal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["attempt", "pause", "999999", "--url", portal.url, "--token", "x" * 8])
    assert capsys.readouterr().err.count("\n") == 1
