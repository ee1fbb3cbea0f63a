"""`baseline image|host|workspace` commands, as a user runs them (real dockerd).

`baseline init` runs as a subprocess, through the same entry point as the installed command;
the other commands call that entry point in this process (tests/cli_entry.py says why).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import cli_entry
from tests.docker_env import LOCAL_URL, docker_url


def _env(home: Path) -> dict[str, str]:
    return cli_entry.home_env(home, BASELINE_DEPLOYMENT=f"test-cli-{home.name}")


def run_process(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return cli_entry.run_process(args, _env(home))


def run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`baseline ARGS` through its entry point in this process."""
    return cli_entry.run_here(args, _env(home))


def _one_line_error(result: subprocess.CompletedProcess[str], needle: str, code: int = 1) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    assert run_process(["init"], tmp_path).returncode == 0
    _one_line_error(run(["image", "build", "tpu"], tmp_path), "unknown hardware profile 'tpu'")
    nowhere = ["--docker-url", f"unix://{tmp_path}/no-engine.sock"]
    _one_line_error(  # the profile name is checked before the engine is reached
        run(["image", "build", "tpu", *nowhere], tmp_path), "unknown hardware profile 'tpu'"
    )
    _one_line_error(run(["image", "build", "cpu", *nowhere], tmp_path), "cannot reach the Docker")
    _one_line_error(run(["host", "add", "x", "ftp://h"], tmp_path), "must start with unix://")
    _one_line_error(run(["host", "check", "ghost"], tmp_path), "no host named ghost")
    _one_line_error(
        run(["host", "add", "g", LOCAL_URL, "--gpus", "A10"], tmp_path), "MODEL:COUNT", 2
    )
    _one_line_error(run(["host", "move-attempt", "999"], tmp_path), "no attempt 999")
    _one_line_error(run(["host", "outage-move", "ghost", "automatic"], tmp_path), "no study named")
    _one_line_error(run(["host", "outage-move", "ghost", "sometimes"], tmp_path), "sometimes", 2)
    assert run(["study", "create", "Pilot"], tmp_path).returncode == 0
    by_id = run(["host", "outage-move", "1", "automatic"], tmp_path)  # an id, as elsewhere
    assert by_id.returncode == 0, by_id.stderr
    probe = run(["host", "probe"], tmp_path)  # no hosts with attempts: nothing to report
    assert probe.returncode == 0 and probe.stdout == "", probe


@pytest.mark.docker
def test_hosts_and_reconcile(tmp_path: Path) -> None:
    docker_url("unix")
    assert run_process(["init"], tmp_path).returncode == 0
    added = run(["host", "add", "here", LOCAL_URL, "--gpus", "NVIDIA A10:2"], tmp_path)
    assert added.returncode == 0 and "healthy" in added.stdout, added
    down = run(["host", "add", "down", "ssh://root@127.0.0.1:1"], tmp_path)
    assert down.returncode == 0 and "UNHEALTHY" in down.stdout
    listing = run(["host", "list"], tmp_path).stdout
    assert "here\t" in listing and "gpus=2" in listing and "down\t" in listing
    check = run(["host", "check"], tmp_path)
    _one_line_error(check, "1 host(s) unhealthy")
    assert "here: healthy" in check.stdout and "down: UNHEALTHY" in check.stdout
    assert run(["host", "check", "here"], tmp_path).returncode == 0
    reconciled = run(["workspace", "reconcile"], tmp_path)
    assert "reconciled: 0 removed, 0 died, 0 restarted, 0 placed" in reconciled.stdout
    assert reconciled.returncode == 1 and "Traceback" not in reconciled.stderr
    assert reconciled.stderr.splitlines() == [
        "error down: host down: cannot reach the Docker Engine at ssh://root@127.0.0.1:1: "
        "[Errno None] Unable to connect to port 1 on 127.0.0.1",
        "error: 1 problem(s) during reconcile",
    ]
