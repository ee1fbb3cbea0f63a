"""The `baseline` command line: help everywhere, one-line errors, the core commands."""

from __future__ import annotations

import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from baseline.cli import cli
from tests import cli_entry


def run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`baseline ARGS` through its entry point in this process (tests/cli_entry.py says why)."""
    return cli_entry.run_here(args, cli_entry.home_env(home))


def run_process(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`python -m baseline ARGS`: for what only a new process shows (it starts, it prints one
    line and no traceback), and for commands that would serve forever if they did not refuse."""
    return cli_entry.run_process(args, cli_entry.home_env(home), timeout=120)


@pytest.fixture
def migrated_home(tmp_path: Path, migrated_sqlite: Path) -> Path:
    """A BASELINE_HOME whose database is at the head revision, as `baseline db upgrade` leaves
    it (a copy of the run's migrated template: the upgrade itself is tested elsewhere)."""
    shutil.copyfile(migrated_sqlite, tmp_path / "baseline.db")
    return tmp_path


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


@pytest.mark.parametrize("path", _all_commands(cli), ids=lambda p: " ".join(p) or "baseline")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert len(result.output.splitlines()) >= 3


@pytest.mark.parametrize("path", _all_commands(cli), ids=lambda p: " ".join(p) or "baseline")
def test_every_option_says_what_it_is_for(path: tuple[str, ...]) -> None:
    """`--help` is where a coordinator learns the options: none is listed bare."""
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    bare = [
        option.opts[0]
        for option in command.params
        if isinstance(option, click.Option) and not option.hidden and not option.help
    ]
    assert bare == [], f"options without help: {bare}"


def test_init_creates_database_and_admin(tmp_path: Path) -> None:
    result = run_process(
        ["init", "--admin-email", "root@x.org", "--admin-password", "password123"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "admin: root@x.org" in result.stdout
    assert (tmp_path / "baseline.db").exists()
    again = run(["init"], tmp_path)
    assert again.returncode == 0 and "an admin exists already" in again.stdout


def test_study_create_and_list(migrated_home: Path) -> None:
    created = run(["study", "create", "Pilot", "--checkpoints", "1,4"], migrated_home)
    assert created.returncode == 0, created.stderr
    listed = run(["study", "list"], migrated_home)
    assert "Pilot" in listed.stdout and "checkpoints 1,4h" in listed.stdout
    duplicate = run(["study", "create", "Pilot"], migrated_home)
    assert duplicate.returncode == 1
    assert duplicate.stderr.strip() == "error: a study named 'Pilot' exists already"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["study", "create", "X", "--checkpoints", "8,2"],
            "checkpoint_hours: must be strictly increasing",
        ),
        (["study", "create", "X", "--checkpoints", "two"], "not a list of numbers"),
        (
            ["study", "create", "X", "--limit-hours", "-1"],
            "working_time_limit_hours: must be a number > 0",
        ),
        (
            ["study", "create", "X", "--idle-pause-minutes", "0"],
            "idle_pause_minutes: must be a number > 0",
        ),
        (
            [
                "user",
                "create",
                "--email",
                "bad",
                "--name",
                "N",
                "--role",
                "grader",
                "--password",
                "password123",
            ],
            "not an e-mail address",
        ),
        (
            [
                "user",
                "create",
                "--email",
                "a@b.c",
                "--name",
                "N",
                "--role",
                "grader",
                "--password",
                "short",
            ],
            "at least 8 characters",
        ),
        (
            [
                "user",
                "create",
                "--email",
                "a@b.c",
                "--name",
                "N",
                "--role",
                "king",
                "--password",
                "x",
            ],
            "'king' is not one of",
        ),
    ],
)
def test_errors_are_one_line(migrated_home: Path, args: list[str], message: str) -> None:
    result = run(args, migrated_home)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: ")


def test_uninitialised_database_is_reported(tmp_path: Path) -> None:
    result = run_process(["study", "list"], tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "baseline init" in result.stderr


def test_serve_refuses_an_old_schema(tmp_path: Path) -> None:
    result = run_process(["serve", "--port", "18999"], tmp_path)
    assert result.returncode == 1
    assert "baseline init" in result.stderr


def test_demo_seeds_idempotently(tmp_path: Path) -> None:
    first = run(["demo", "--no-serve"], tmp_path)
    assert first.returncode == 0, first.stderr
    second = run(["demo", "--no-serve"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout
    for role in ("admin", "coordinator", "grader", "analyst", "participant"):
        assert f"{role}@example.org" in first.stdout


def test_a_demo_on_a_taken_port_says_so_before_it_seeds_or_starts_anything(tmp_path: Path) -> None:
    """It seeded its studies and launched its live workspaces, printed "Baseline portal on
    http://127.0.0.1:P/", and then said only "Address already in use"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_process(["demo", "--port", str(port)], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: port {port} on 127.0.0.1 is in use (another Baseline portal or demo?): "
        "choose another with --port"
    )
    assert result.stdout == "" and not (tmp_path / "baseline.db").exists()


def test_study_create_stores_the_snapshot_policy(migrated_home: Path) -> None:
    created = run(
        ["study", "create", "Like PaperBench", "--snapshot-policy", "paperbench"], migrated_home
    )
    assert created.returncode == 0, created.stderr
    bad = run(["study", "create", "X", "--snapshot-policy", "everything"], migrated_home)
    assert (
        bad.returncode == 2 and "'everything' is not one of 'baseline', 'paperbench'" in bad.stderr
    )
    with sqlite3.connect(migrated_home / "baseline.db") as db:
        stored = db.execute("SELECT name, snapshot_policy FROM studies").fetchall()
    assert stored == [("Like PaperBench", "paperbench")]
