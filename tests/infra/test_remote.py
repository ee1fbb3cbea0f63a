"""Host commands over a real sshd on 127.0.0.1, and host health checks over both channels."""

from __future__ import annotations

import pytest

from infra.remote import RemoteError, SshRunner, SshTarget, check_host, runner_for_url
from tests.docker_env import docker_url

pytestmark = [pytest.mark.sshd, pytest.mark.docker]


def test_ssh_runner_runs_commands_and_reports_exit_codes() -> None:
    url = docker_url("ssh")
    runner = runner_for_url(url)
    assert isinstance(runner, SshRunner)
    try:
        echo = runner(["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (echo.exit_code, echo.stdout, echo.stderr) == (7, "out\n", "err\n")
        missing = runner(["nvidia-smi-that-is-not-there"])
        assert missing.exit_code == 127  # what the GPU inventory reads as "no nvidia-smi"
        quoted = runner(["printf", "%s", "a b; rm -rf /"])
        assert quoted.stdout == "a b; rm -rf /"  # arguments are quoted, never interpreted
    finally:
        runner.close()


def test_unknown_host_key_and_bad_port_are_refused() -> None:
    url = docker_url("ssh")
    target = SshTarget.from_url(url)
    # Same server, but under a name whose host key is not in known_hosts: refused, not trusted.
    with pytest.raises(RemoteError, match="not found in known_hosts"):
        SshRunner(SshTarget("localhost", target.port, target.user, target.key_filename))(["true"])
    with pytest.raises(RemoteError):
        SshRunner(SshTarget(target.host, 1, target.user, target.key_filename))(["true"])
    with pytest.raises(RemoteError, match="not an ssh"):
        SshTarget.from_url("http://example")


@pytest.mark.parametrize("kind", ["unix", "ssh"])
def test_check_host_reports_engine_facts(kind: str) -> None:
    health = check_host(docker_url(kind))
    assert health.healthy, health.error
    assert health.docker_version and health.cpus and health.cpus >= 1
    assert health.memory_mib and health.memory_mib > 0


def test_check_host_names_the_failure() -> None:
    health = check_host("ssh://root@127.0.0.1:1")
    assert not health.healthy and health.error and "127.0.0.1" in health.error
