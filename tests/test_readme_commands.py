"""The README's command sequences for agents, run as written (issue 36: its own
`baseline attempt launch ID && baseline agent run ID` drove one attempt twice).

Each command line of a README block is read from the README itself (continuations joined,
comments dropped), `&&` runs the next command only after the previous one exited 0, and every
command goes through the CLI's own entry point in this process (a subprocess costs seconds of
imports each). Only the placeholders are filled in: the study `Pilot` exists with the demo paper
task, `ATTEMPT_ID` is the first attempt the block's enrolment printed, and the provider's
endpoint is a scripted model on this machine whose agent ends the task at its first step.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from sqlalchemy import select

from baseline.cli import main
from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    Host,
    Workspace,
    WorkspaceStatus,
)
from baseline.runs.transcripts import run_of
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from tests.agents.agent_world import Script, call
from tests.docker_env import LOCAL_URL, test_image
from tests.fake_openai import FakeOpenAI

README = Path(__file__).resolve().parents[1] / "README.md"
PROVIDER = "https://api.openai.com/v1"

__all__ = ["test_image"]


@pytest.fixture
def cleanup(ctx: Context) -> Iterator[None]:
    """The workspaces the CLI made, destroyed as it made them (its backend, disk bound and all)."""
    yield
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, workspaces.backend_for_host)


def readme_block(section: str, index: int = 0) -> list[str]:
    """The command lines of the `index`-th sh block under the README heading `section`."""
    text = README.read_text()
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```sh\n(.*?)```", text[start : end if end > 0 else None], re.DOTALL)
    joined = blocks[index].replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip()]


def commands(line: str) -> list[list[str]]:
    """One line's commands, in `&&` order, each without its leading `baseline`."""
    words = shlex.split(line, comments=True)
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    for part in parts:
        assert part[0] == "baseline", f"not a baseline command: {line}"
    return [part[1:] for part in parts]


@contextlib.contextmanager
def cli_env(ctx: Context) -> Iterator[None]:
    env = {"BASELINE_HOME": str(ctx.settings.home),
           "BASELINE_DATABASE_URL": ctx.settings.database_url}  # fmt: skip
    with mock.patch.dict(os.environ, env):
        yield


def run(args: list[str]) -> str:
    """One command through the CLI's entry point; its output, after checking it exited 0."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    assert code == 0, f"baseline {shlex.join(args)} exited {code}: {out.getvalue()}{err.getvalue()}"
    return out.getvalue()


def pilot(ctx: Context) -> None:
    """The README's study: `Pilot`, with the demo paper task."""
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Pilot"), None)
        paper = next(t for t in tasks.import_demo_tasks(session, ctx.settings)
                     if t.slug == "digits-baselines")  # fmt: skip
        studies.add_task(session, study, paper, None)


def test_the_blocks_parse_into_baseline_commands() -> None:
    built_in = readme_block("## Built-in AI agents")
    assert [c[0][:2] for c in map(commands, built_in)] == [
        ["agent", "enrol"], ["attempt", "launch"], ["agent", "resume"],
        ["agent", "transcript"], ["attempt", "monitor"],
    ]  # fmt: skip
    assert commands(built_in[1])[1][:2] == ["agent", "run"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.sqlite_only("the README's commands; the database is incidental")
def test_the_built_in_agent_sequence_runs_as_written(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    with ctx.session() as session:
        if session.scalar(select(Host).where(Host.name == "local")) is None:
            host = workspaces.add_host(session, "local", LOCAL_URL, None)
            assert workspaces.check_host(session, host).healthy
    pilot(ctx)
    script = Script([call("end_task", message="done")])
    outputs: dict[str, str] = {}
    with FakeOpenAI(answer=script) as model, cli_env(ctx):
        lines = readme_block("## Built-in AI agents")
        enrolled = run(commands(lines[0].replace(PROVIDER, model.base_url))[0])
        attempt_ids = re.findall(r"\d+", enrolled.split("attempts", 1)[1])
        assert len(attempt_ids) == 3, enrolled  # --runs 3
        for line in lines[1:]:
            for args in commands(line.replace("ATTEMPT_ID", attempt_ids[0])):
                outputs[" ".join(args[:2])] = run(args)
    attempt_id = int(attempt_ids[0])
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.SUBMITTED
        run_row = run_of(session, attempt_id)
        assert run_row is not None and run_row.status is AgentRunStatus.FINISHED
        stopped = session.scalars(
            select(Workspace.status).where(Workspace.attempt_id == attempt_id)
        )
        assert list(stopped) == [WorkspaceStatus.STOPPED]  # ended: stopped, kept
    assert (
        outputs["agent run"].strip() == "run 1: finished after 1 steps (the agent ended the task)"
    )
    assert outputs["agent resume"].strip() == "no unfinished agent runs"
    transcript = [json.loads(line) for line in outputs["agent transcript"].splitlines()]
    assert transcript[0]["scaffold"] == "basic" and len(transcript) > 2
    assert outputs["attempt monitor"].strip().endswith("0 new hit(s)")
    assert len(script.bodies) == 1  # one driver, one model call


@pytest.mark.sqlite_only("the README's commands; the database is incidental")
def test_the_command_agent_enrolment_runs_as_written(ctx: Context) -> None:
    (line,) = readme_block("### Command agents (external agent programs) and the agent worker")
    pilot(ctx)
    with cli_env(ctx):
        enrolled = run(commands(line)[0])
    assert re.match(r"enrolled participant \d+ \(command:o3, settings [0-9a-f]{12}\)", enrolled)
