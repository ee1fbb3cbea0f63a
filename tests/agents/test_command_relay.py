"""The model relay on local and ssh:// Docker hosts, in a workspace without any network.

The relay carries requests out on the exec stream and answers back by copy-in, both the
backend's own channels, so a command agent reaches its passthrough wherever the workspace runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from baseline.runs.command_agents import BASE_URL, RELAY_DIR, RelayChannel
from baseline.runs.model_passthrough import ProxyRequest, ProxyResponse
from infra.docker_backend import DockerBackend
from infra.workspace import PARTICIPANT_USER, HardwareProfile, WorkspaceHandle, WorkspaceSpec
from tests.docker_env import backend, new_name, test_image

pytestmark = [pytest.mark.docker]
__all__ = ["backend", "test_image"]

CLIENT = f"""
import json, urllib.request
request = urllib.request.Request("{BASE_URL}/chat/completions", b'{{"q": 1}}',
                                 {{"Authorization": "Bearer k-1"}})
with urllib.request.urlopen(request, timeout=30) as answer:
    print(answer.status, answer.read().decode())
"""


@pytest.fixture
def workspace(backend: DockerBackend, test_image: str) -> Iterator[WorkspaceHandle]:
    profile = HardwareProfile("relay-test", cpus=0.5, memory_mb=256, pids=128)
    handle = backend.create(WorkspaceSpec(name=new_name(), image=test_image, profile=profile))
    backend.start(handle)
    yield handle
    backend.destroy(handle)


def test_the_relay_carries_requests_without_a_network(
    backend: DockerBackend, workspace: WorkspaceHandle
) -> None:
    seen: list[ProxyRequest] = []

    def answer(request: ProxyRequest) -> ProxyResponse:
        seen.append(request)
        return ProxyResponse(201, json.dumps({"echo": request.body.decode()}).encode())

    channel = RelayChannel(backend, workspace, answer)
    channel.start()
    try:
        result = backend.exec(workspace, ["python3", "-c", CLIENT], user=PARTICIPANT_USER,
                              timeout_s=60)  # fmt: skip
        assert result.output.decode().strip() == '201 {"echo": "{\\"q\\": 1}"}'
        (request,) = seen
        assert (request.method, request.path) == ("POST", "/v1/chat/completions")
        assert request.headers["authorization"] == "Bearer k-1"
        # The workspace user cannot plant answers for the relay.
        planted = backend.exec(workspace, ["touch", f"{RELAY_DIR}/out/x.done"],
                               user=PARTICIPANT_USER, timeout_s=30)  # fmt: skip
        assert planted.exit_code != 0
    finally:
        channel.stop()


@pytest.mark.parametrize("backend", ["unix"], indirect=True)  # the same channels on ssh://
def test_a_request_in_flight_when_its_worker_dies_is_answered_by_the_next_worker(
    backend: DockerBackend, workspace: WorkspaceHandle
) -> None:
    """The agent's model call waits while its worker dies: the restarted worker's channel
    answers it. Before, the new relay killed the old one and the agent's connection was cut."""
    received, gate = threading.Event(), threading.Event()

    def dying(request: ProxyRequest) -> ProxyResponse:
        received.set()  # the old worker got it and dies before it answers
        gate.wait(60)
        return ProxyResponse(500, b'{"stale": true}')

    old = RelayChannel(backend, workspace, dying)
    old.start()
    done: list[str] = []
    client = threading.Thread(target=lambda: done.append(_ask(backend, workspace)))
    client.start()
    new: RelayChannel | None = None
    try:
        assert received.wait(30), "the request never reached the first worker"
        new = RelayChannel(backend, workspace, lambda r: ProxyResponse(201, b'{"fresh": 1}'))
        new.start()  # the restarted worker
        client.join(60)
        assert done == ['201 {"fresh": 1}']
    finally:
        gate.set()
        client.join(60)
        if new is not None:
            new.stop()
    left = backend.exec(workspace, ["sh", "-c", "grep -l 'relay[.]py' /proc/[0-9]*/cmdline; true"],
                        user="root", timeout_s=30)  # fmt: skip
    assert left.output.decode().strip() == "", "a relay process outlived its stop"


def _ask(backend: DockerBackend, workspace: WorkspaceHandle) -> str:
    result = backend.exec(workspace, ["python3", "-c", CLIENT], user=PARTICIPANT_USER,
                          timeout_s=60)  # fmt: skip
    return result.output.decode().strip()
