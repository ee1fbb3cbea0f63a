"""Runs a METR Task Standard family's hooks; copied next to the family, run by its own Python.

This file is stored with every imported family (PROTECTED) and run as a separate process in a
container, never on the portal's host: at import (``inspect``, in a throwaway offline container
of the family's image, after ``install()``), as root at image build (``install``), as root in
start's setup container (``start``), as root in the participant's workspace (``teardown``), and
as root in a container of the attempt's state (``score``, ``intermediate``:
`scoring.task_standard_scoring`). It uses only the standard library, because it runs in whatever
Python the workspace image has. Usage::

    python3 task_standard_hook.py FAMILY inspect
    python3 task_standard_hook.py FAMILY install
    python3 task_standard_hook.py FAMILY start TASK
    python3 task_standard_hook.py FAMILY teardown TASK
    python3 task_standard_hook.py FAMILY score TASK SUBMISSION_DIR
    python3 task_standard_hook.py FAMILY intermediate TASK SUBMISSION_DIR

``score`` and ``intermediate`` print, as their last line, the JSON ``{"score": x, "message": m}``
that Baseline's scoring contract reads (``scoring.scored_task.parse_score_output``; a NaN score,
"no valid solution", keeps its message). A family that defines ``aggregate_scores`` (RE-Bench's,
which have no ``score``) is scored as Vivaria scores it at submission: ``intermediate_score`` once
more on the submission, appended to the attempt's score log (which Baseline puts beside this file
as ``SCORE_LOG_NAME``), and ``aggregate_scores(task, score_log)`` of them all. The Task
Standard's agent home ``/home/agent`` is Baseline's submission directory: when scoring, where it
does not exist it is made a symbolic link to it, so a family that reads ``/home/agent/solution``
finds the participant's files. ``start`` writes into a real ``/home/agent``, the agent's, that
Baseline then moves into the submission. The family lives in ``/root``, as the standard has it
(this file beside it; a snapshot scored from its files in a fresh container gets the family
copied there from the scoring material first).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pwd
import shutil
import sys
from typing import Any

AGENT_HOME = "/home/agent"
AGENT_USER = "agent"  # the participant's uid under the standard's name (infra.image_build)
SUBMISSION_FILE = "submission.txt"  # the Task Standard's submission string, when one is given
SCORE_LOG_NAME = "_baseline_score_log.json"  # the attempt's intermediate scores, for aggregation
FAMILY_HOME = "/root"  # where the Task Standard puts the family (its code reads /root/assets/...)


def _family_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _at_family_home(here: str) -> str:
    """The family copied from `here` (the scoring material's folder) to /root, where it was when
    the task started, so that scoring code reading /root/assets/... finds it; cwd /root."""
    if os.path.realpath(here) != FAMILY_HOME:
        shutil.copytree(here, FAMILY_HOME, dirs_exist_ok=True)
        os.chmod(FAMILY_HOME, 0o700)  # copytree gave it the material folder's mode
    os.chdir(FAMILY_HOME)
    return FAMILY_HOME


def _family(name: str, here: str) -> Any:
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


def _fields(task: Any) -> dict[str, Any]:
    """The task dict's scalar fields (numbers, short strings, booleans), by which Baseline's
    import finds the normalisation constants a family keeps under names of its own."""
    if not isinstance(task, dict):
        return {}
    fields: dict[str, Any] = {}
    for key, value in task.items():
        number = _number(value)
        if isinstance(value, bool) or (isinstance(value, str) and len(value) <= 200):
            fields[str(key)] = value
        elif number is not None:
            fields[str(key)] = number
    return fields


def inspect(family: Any) -> dict[str, Any]:
    tasks = family.get_tasks()
    described = {}
    for name, task in tasks.items():
        permissions = family.get_permissions(task) if _optional(family, "get_permissions") else []
        aux_vm = family.get_aux_vm_spec(task) if _optional(family, "get_aux_vm_spec") else None
        described[name] = {
            "instructions": family.get_instructions(task),
            "permissions": list(permissions),
            "fields": _fields(task),
            "aux_vm": aux_vm is not None,
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


def _result(value: Any, hook: str) -> dict[str, Any]:
    """A hook's return value as the scoring contract's JSON: a bare number, or a dict with score
    and message (the Task Standard's IntermediateScoreResult); None asks for manual scoring."""
    if value is None:
        return {"score": None, "message": f"the family's {hook}() returned None"}
    if isinstance(value, dict):
        message = value.get("message") or ""
        text = message if isinstance(message, str) else json.dumps(message, default=str)
        return {"score": value.get("score"), "message": text}
    return {"score": value, "message": ""}


def _score_log() -> dict[str, Any]:
    path = os.path.join(FAMILY_HOME, SCORE_LOG_NAME)
    if not os.path.isfile(path):
        return {"score_log": [], "now": {}}
    with open(path, encoding="utf-8") as file:
        data: dict[str, Any] = json.load(file)
    return data


def aggregate(family: Any, task: Any) -> dict[str, Any]:
    """aggregate_scores over the attempt's score log and one last intermediate score of this
    submission (what Vivaria does when an agent submits)."""
    log = _score_log()
    entries: list[dict[str, Any]] = list(log.get("score_log", []))
    if _optional(family, "intermediate_score"):
        last = family.intermediate_score(task)
        if last is not None:
            entry = last if isinstance(last, dict) else {"score": last}
            entries.append(
                {
                    "score": entry.get("score"),
                    "message": entry.get("message") or {},
                    "details": entry.get("details") or {},
                    **log.get("now", {}),
                }
            )
    return _result(family.aggregate_scores(task, entries), "aggregate_scores")


def score(family: Any, task: Any, submission: str) -> dict[str, Any]:
    _map_agent_home(submission)
    if _optional(family, "aggregate_scores"):
        return aggregate(family, task)
    path = os.path.join(submission, SUBMISSION_FILE)
    text = ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            # An editor ends the file with a newline the answer does not hold.
            text = file.read().removesuffix("\n").removesuffix("\r")
    value = family.score(task, text)
    if value is None:
        return {"score": None, "message": "the family's score() returned None (manual scoring)"}
    return _result(value, "score")


def intermediate(family: Any, task: Any, submission: str) -> dict[str, Any]:
    _map_agent_home(submission)
    if not _optional(family, "intermediate_score"):
        return {"score": None, "message": "the family has no intermediate_score()"}
    return _result(family.intermediate_score(task), "intermediate_score")


def main(argv: list[str]) -> None:
    command, here = argv[2], _family_dir()
    if command in ("score", "intermediate"):
        here = _at_family_home(here)
    family = _family(argv[1], here)
    if command == "inspect":
        print(json.dumps(inspect(family), default=str))
    elif command == "install":
        if _optional(family, "install"):
            family.install()
    elif command == "start":
        # The agent's home, the agent's (as the standard's image has it), in start's own setup
        # container; Baseline moves it into the participant's submission afterwards.
        os.makedirs(AGENT_HOME, exist_ok=True)
        agent = pwd.getpwnam(AGENT_USER)
        os.chown(AGENT_HOME, agent.pw_uid, agent.pw_gid)
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
