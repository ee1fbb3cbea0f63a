"""A worker process that runs one attempt's agent, for the SIGKILL test.

Usage: python -m tests.agents.agent_worker DATABASE_URL HOME ATTEMPT_ID TEST_RUN_ID
"""

from __future__ import annotations

import sys
from pathlib import Path

from baseline.config import Settings
from baseline.context import Context
from baseline.models import Host
from baseline.runs.agent_runs import AgentLoop
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from tests.docker_env import TEST_RUN_LABEL


def main(database_url: str, home: str, attempt_id: str, run_id: str) -> None:
    def factory(host: Host) -> WorkspaceBackend:
        return DockerBackend.from_url(host.docker_url, labels={TEST_RUN_LABEL: run_id})

    settings = Settings(home=Path(home), database_url=database_url, secret_key="test-secret")
    AgentLoop(Context.from_settings(settings), int(attempt_id), backend_factory=factory).run()


if __name__ == "__main__":
    main(*sys.argv[1:5])
