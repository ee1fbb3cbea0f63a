"""Runs a METR Task Standard family's hooks; copied next to the family, run by its own Python.

This file is stored with every imported family (PROTECTED) and run as a separate process: on the
host at import (``inspect``, a subprocess with a time-out, never inside the portal), as root at
image build (``install``), as root in the participant's workspace (``start``), and as root in the
scoring container (``score``, ``intermediate``). It uses only the standard library, because it
runs in whatever Python the workspace image has. Usage::

    python3 task_standard_hook.py FAMILY inspect
    python3 task_standard_hook.py FAMILY install
    python3 task_standard_hook.py FAMILY start TASK
    python3 task_standard_hook.py FAMILY teardown TASK
    python3 task_standard_hook.py FAMILY score TASK SUBMISSION_DIR
    python3 task_standard_hook.py FAMILY intermediate TASK SUBMISSION_DIR

``score`` and ``intermediate`` print, as their last line, the JSON ``{"score": x, "message": m}``
that Baseline's scoring contract reads (``scoring.scored_task.parse_score_output``). The Task
Standard's agent home ``/home/agent`` is Baseline's submission directory: when scoring, where it
does not exist it is made a symbolic link to it, so a family that reads ``/home/agent/solution``
finds the participant's files. ``start`` writes into a real ``/home/agent`` that Baseline then moves
into the submission.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from typing import Any

AGENT_HOME = "/home/agent"
SUBMISSION_FILE = "submission.txt"  # the Task Standard's submission string, when one is given


def _family(name: str) -> Any:
    here = os.environ.get("BASELINE_FAMILY_DIR") or os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    return importlib.import_module(name).TaskFamily


def _task(family: Any, name: str) -> Any:
    tasks = family.get_tasks()
    if name not in tasks:
        raise SystemExit(f"the family has no task {name!r} (it has {sorted(tasks)})")
    return tasks[name]


def _map_agent_home(submission: str) -> None:
    if not os.path.lexists(AGENT_HOME):
        os.symlink(submission, AGENT_HOME)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _optional(family: Any, name: str) -> bool:
    return callable(getattr(family, name, None))


def inspect(family: Any) -> dict[str, Any]:
    tasks = family.get_tasks()
    described = {}
    for name, task in tasks.items():
        permissions = family.get_permissions(task) if _optional(family, "get_permissions") else []
        described[name] = {
            "instructions": family.get_instructions(task),
            "permissions": list(permissions),
            "starting_score": _number(task.get("starting_score")),
            "reference_score": _number(task.get("reference_score")),
            "direction": task.get("score_direction"),
            "log_transform": bool(task.get("log_transform", False)),
        }
    return {
        "standard_version": getattr(family, "standard_version", None),
        "required_environment_variables": list(
            getattr(family, "required_environment_variables", [])
        ),
        "hooks": sorted(
            hook
            for hook in (
                "install",
                "start",
                "teardown",
                "score",
                "intermediate_score",
                "aggregate_scores",
            )
            if _optional(family, hook)
        ),
        "tasks": described,
    }


def score(family: Any, task: Any, submission: str) -> dict[str, Any]:
    _map_agent_home(submission)
    path = os.path.join(submission, SUBMISSION_FILE)
    text = ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            text = file.read()
    value = family.score(task, text)
    if value is None:
        return {"score": None, "message": "the family's score() returned None (manual scoring)"}
    return {"score": value, "message": ""}


def intermediate(family: Any, task: Any, submission: str) -> dict[str, Any]:
    _map_agent_home(submission)
    if not _optional(family, "intermediate_score"):
        return {"score": None, "message": "the family has no intermediate_score()"}
    result = family.intermediate_score(task)
    if result is None:
        return {"score": None, "message": "the family's intermediate_score() returned None"}
    message = result.get("message", "")
    return {"score": result.get("score"), "message": json.dumps(message, default=str)}


def main(argv: list[str]) -> None:
    family = _family(argv[1])
    command = argv[2]
    if command == "inspect":
        print(json.dumps(inspect(family), default=str))
    elif command == "install":
        if _optional(family, "install"):
            family.install()
    elif command == "start":
        # A real directory here: root in a workspace has no capabilities, so it cannot write
        # into the participant's submission; Baseline moves this into it afterwards.
        os.makedirs(AGENT_HOME, exist_ok=True)
        if _optional(family, "start"):
            family.start(_task(family, argv[3]))
    elif command == "teardown":
        if _optional(family, "teardown"):
            family.teardown(_task(family, argv[3]))
    elif command == "score":
        print(json.dumps(score(family, _task(family, argv[3]), argv[4]), default=str))
    elif command == "intermediate":
        print(json.dumps(intermediate(family, _task(family, argv[3]), argv[4]), default=str))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv)
