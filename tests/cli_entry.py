"""`baseline ARGS` as a user runs it: through the installed entry point in a new process, or
through that same entry point (`baseline.cli.main`) in this one.

A new process costs seconds of imports on a loaded CI machine and shows nothing the call in
this process does not (the same arguments, environment, output and exit status; an uncaught
exception fails the test here). So most tests call `run_here`, and a few keep `run_process` to
show the entry point itself: that `python -m baseline` starts, and what a process prints.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from unittest import mock

from baseline.cli import main


def home_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a CLI working on the database of `home` (the test run's
    own BASELINE_DATABASE_URL, if any, left out), plus `extra`."""
    env = {**os.environ, "BASELINE_HOME": str(home), **extra}
    env.pop("BASELINE_DATABASE_URL", None)
    return env


def run_process(
    args: list[str], env: Mapping[str, str], stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m baseline ARGS` in a new process with exactly `env`."""
    return subprocess.run(
        [sys.executable, "-m", "baseline", *args],
        env=dict(env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_here(args: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`baseline ARGS` through its entry point in this process, with exactly `env` as the
    environment while it runs; its output and exit status as a finished process's."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with (
        mock.patch.dict(os.environ, dict(env), clear=True),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            main(args)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())
