"""`baseline snapshot ...` and `baseline attempt ...`: outputs, exit codes, one-line errors."""

from __future__ import annotations

import csv
import io
import tarfile
from pathlib import Path

import pytest

from baseline.attempts import attempts
from baseline.cli import main
from baseline.context import Context
from baseline.models import Attempt
from tests.baseline.attempt_world import directory_resolver, make_attempt


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def env(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> Context:
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)
    return ctx


def test_snapshot_commands(
    env: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "a.py").write_text("a")
    attempt_id = make_attempt(env)
    attempts.start(env, attempt_id, None, directory_resolver(sub))
    (sub / "b.py").write_text("b")
    attempts.manual_snapshot(env, attempt_id, None, directory_resolver(sub))

    code, out, _ = run(capsys, "snapshot", "list", str(attempt_id))
    assert code == 0 and "start" in out and "manual" in out
    ids = [int(line.split()[0]) for line in out.splitlines()]
    code, out, _ = run(capsys, "snapshot", "diff", str(ids[0]), str(ids[1]))
    assert (code, out) == (0, "+ b.py\n")
    target = tmp_path / "out" / "submission.tar.gz"
    code, out, _ = run(capsys, "snapshot", "export", str(ids[1]), "--out", str(target))
    assert code == 0
    with tarfile.open(target) as archive:
        assert sorted(archive.getnames()) == ["submission", "submission/a.py", "submission/b.py"]
    code, out, _ = run(capsys, "snapshot", "verify", "--attempt", str(attempt_id))
    assert (code, out) == (0, "2 of 2 snapshots intact\n")

    store_file = next(
        p
        for p in (env.settings.home / "blobs").rglob("*")
        if p.is_file() and p.read_bytes() == b"b"
    )
    store_file.chmod(0o644)
    store_file.write_bytes(b"x")
    code, out, _ = run(capsys, "snapshot", "verify")
    assert code == 1 and "b.py" in out and "1 of 2 snapshots intact" in out


def test_attempt_clock_commands(
    env: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attempt_id = make_attempt(env, limit_hours=2)
    attempts.start(env, attempt_id, None, directory_resolver(tmp_path))
    assert run(capsys, "attempt", "pause", str(attempt_id), "--reason", "outage")[0] == 0
    code, out, _ = run(capsys, "attempt", "clock", str(attempt_id))
    assert code == 0 and "paused (outage)" in out
    code, _, err = run(capsys, "attempt", "pause", str(attempt_id))
    assert code == 1 and err.count("\n") == 1 and "already paused" in err
    assert run(capsys, "attempt", "resume", str(attempt_id))[0] == 0
    code, out, _ = run(
        capsys, "attempt", "extend", str(attempt_id), "--hours", "1.5", "--reason", "outage"
    )
    assert code == 0 and "3.5 working hours" in out
    # asked from the limit it was (a script answering one incident twice): added once
    once = ("attempt", "extend", str(attempt_id), "--hours", "1", "--reason", "outage 2")
    code, out, _ = run(capsys, *once, "--if-limit-is", "3.5")
    assert code == 0 and "4.5 working hours" in out
    code, _, err = run(capsys, *once, "--if-limit-is", "3.5")
    assert code == 1 and "the limit is 4.5 working hours now, not 3.5" in err
    code, _, err = run(
        capsys, "attempt", "extend", str(attempt_id), "--hours", "-2", "--reason", "x"
    )  # in the unit given, not "must be a positive number of seconds, got -7200.0"
    assert code == 2 and "Invalid value for '--hours': -2.0 is not in the range x>0" in err
    with env.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        study_id, study_name = attempt.study_id, attempt.study.name
    code, out, _ = run(capsys, "attempt", "time", "--study", str(study_id), "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["attempt_id"] for r in rows] == [str(attempt_id)]
    assert float(rows[0]["working_hours"]) >= 0
    # named as every other command names a study; an unknown one is an error, not an empty list
    named = run(capsys, "attempt", "time", "--study", study_name, "--csv")[1]
    assert [r["attempt_id"] for r in csv.DictReader(io.StringIO(named))] == [str(attempt_id)]
    code, out, err = run(capsys, "attempt", "time", "--study", "no such study")
    assert code == 1 and out == "" and "no study named or numbered 'no such study'" in err
    code, _, err = run(capsys, "snapshot", "list", "999")
    assert code == 1 and err == "error: no attempt with id 999\n"
    code, _, err = run(capsys, "snapshot", "take", str(attempt_id))
    assert code == 1 and "no workspace or submission volume" in err
    code, _, err = run(capsys, "attempt", "withdraw", str(attempt_id), "--reason", "oops")
    assert code == 1 and f"attempt {attempt_id} was launched" in err
    mistake = make_attempt(env)  # never launched
    code, out, _ = run(capsys, "attempt", "withdraw", str(mistake), "--reason", "wrong task")
    assert (code, out) == (0, f"attempt {mistake} withdrawn\n")
    with env.session() as session:
        assert session.get(Attempt, mistake) is None
    assert run(capsys, "attempt", "disqualify", str(attempt_id), "--reason", "cheating")[0] == 0
    code, _, err = run(capsys, "attempt", "resume", str(attempt_id))
    assert code == 1 and "not paused" in err
    code, out, _ = run(capsys, "attempt", "clock", str(attempt_id))
    assert "[disqualified]" in out


def test_a_clock_waiting_for_the_first_login_reads_not_started(
    env: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It read "paused (not_started)", where the portal and `study watch` say "not started"."""
    attempt_id = make_attempt(env, human=True, limit_hours=2)
    attempts.start(env, attempt_id, None, directory_resolver(tmp_path))
    code, out, _ = run(capsys, "attempt", "clock", str(attempt_id))
    assert code == 0
    assert out == f"attempt {attempt_id} [ready] not started: 0.000 of 2 working hours used\n"
