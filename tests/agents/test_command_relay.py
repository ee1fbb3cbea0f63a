"""The model relay on local and ssh:// Docker hosts, in a workspace without any network.

The relay carries requests out on the exec stream and answers back by copy-in, both the
backend's own channels, so a command agent reaches its passthrough wherever the workspace runs.
"""

from __future__ import annotations

import json
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
