"""The scaffold extension point: what differs between agent designs, and nothing else.

A scaffold decides the tools offered, the opening messages, what to say when the model answers
without calling a tool, and the periodic reminder. The run loop (`baseline.runs.agent_runs`) owns
everything that must be the same for every agent: the clock, limits, retries, the transcript,
checkpoints and the workspace. Scaffolds register by name, like workspace backends; the name is
what a study records as a participant's ``agent_scaffold``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agents.tools import END_TASK

REMINDER_EVERY_STEPS = 5
# The heading an EXP-Bench task's instructions start with (baseline.tasks.expbench writes them).
# Such a task's reproduce.sh is the platform's wrapper that runs the reproduce_exp_bench.sh the
# instructions ask for: an agent told to write reproduce.sh overwrote the wrapper; and it must
# not use git, which an agent told to commit its work did.
EXPBENCH_HEADING = "# EXP-Bench task"


@dataclass(frozen=True)
class TaskBrief:
    """What the agent is told about its task: the same materials a human gets in /home/paper."""

    title: str
    instructions: str
    files: tuple[str, ...]  # paths under /home/paper


@dataclass(frozen=True)
class TimeStatus:
    used_s: float
    limit_s: float

    @property
    def left_s(self) -> float:
        return max(self.limit_s - self.used_s, 0.0)


@runtime_checkable
class Scaffold(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools offered (names in `agents.tools.SPECS`)."""
        ...

    @property
    def can_end(self) -> bool: ...

    def system_prompt(self, brief: TaskBrief, limit_s: float) -> str: ...

    def task_message(self, brief: TaskBrief) -> str: ...

    def continue_message(self, brief: TaskBrief) -> str:
        """Said when the model answered without calling a tool."""
        ...

    def reminder(self, brief: TaskBrief, time: TimeStatus) -> str: ...


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def _forbids_git(brief: TaskBrief) -> bool:
    """An EXP-Bench task forbids git operations (its monitor flags them) and names its own
    script in the instructions: neither committing nor reproduce.sh is asked of its agent, in
    the opening messages or in any later one."""
    return brief.instructions.startswith(EXPBENCH_HEADING)


def _keep_work(brief: TaskBrief) -> str:
    """The reminder's last sentence: PaperBench's agents are told to commit regularly."""
    if _forbids_git(brief):
        return "Remember to keep your work in /home/submission (no git commands)."
    return "Remember to commit your work in /home/submission."


def _submission(brief: TaskBrief) -> str:
    """What the agent is told about /home/submission and its script (`_forbids_git`)."""
    if _forbids_git(brief):
        return (
            "Put everything you produce in /home/submission: snapshots of it are graded as the "
            "files are, so no git command is needed (your instructions forbid git operations). "
        )
    return (
        "Put everything you produce in /home/submission, a git repository: commit your work "
        "regularly, since snapshots of it are graded. A reproduce.sh at the top of "
        "/home/submission must reproduce your results in a fresh copy of this workspace. "
    )


def _time_reminder(brief: TaskBrief, time: TimeStatus) -> str:
    return (
        f"Time used: {_hours(time.used_s)} of {_hours(time.limit_s)} "
        f"({_hours(time.left_s)} left). {_keep_work(brief)}"
    )


def _system(brief: TaskBrief, limit_s: float, ending: str) -> str:
    return (
        "You are an AI researcher working on a task in a Linux workspace. The task's materials "
        "are in /home/paper (read-only): "
        + ", ".join(brief.files)
        + ". "
        + _submission(brief)
        + f"You have {_hours(limit_s)} of working time. {ending}"
    )


@dataclass(frozen=True)
class BasicScaffold:
    """PaperBench's basic agent: every tool, and it may end the task early."""

    name: str = "basic"
    tools: tuple[str, ...] = ("bash", "python", "read_file_chunk", "search_file", END_TASK)
    can_end: bool = True

    def system_prompt(self, brief: TaskBrief, limit_s: float) -> str:
        return _system(brief, limit_s, f"Call {END_TASK} when your submission is complete.")

    def task_message(self, brief: TaskBrief) -> str:
        return f"Task: {brief.title}\n\n{brief.instructions}"

    def continue_message(self, brief: TaskBrief) -> str:
        return f"Please continue working with the tools, or call {END_TASK} if you are done."

    def reminder(self, brief: TaskBrief, time: TimeStatus) -> str:
        return _time_reminder(brief, time)


@dataclass(frozen=True)
class IterativeScaffold:
    """PaperBench's iterative agent: shell and file reader only; it works until time runs out."""

    name: str = "iterative"
    tools: tuple[str, ...] = ("bash", "read_file_chunk")
    can_end: bool = False

    def system_prompt(self, brief: TaskBrief, limit_s: float) -> str:
        return _system(
            brief, limit_s, "You cannot end early: keep improving your submission until time is up."
        )

    def task_message(self, brief: TaskBrief) -> str:
        return f"Task: {brief.title}\n\n{brief.instructions}"

    def continue_message(self, brief: TaskBrief) -> str:
        keep = "in /home/submission" if _forbids_git(brief) else "committed"
        return (
            "Continue working on the task with the next step; use the tools, and keep your "
            f"submission {keep}."
        )

    def reminder(self, brief: TaskBrief, time: TimeStatus) -> str:
        return _time_reminder(brief, time)


_REGISTRY: dict[str, Callable[[], Scaffold]] = {
    "basic": BasicScaffold,
    "iterative": IterativeScaffold,
}


class UnknownScaffold(KeyError):
    pass


def register(name: str, factory: Callable[[], Scaffold]) -> None:
    _REGISTRY[name] = factory


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Scaffold:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise UnknownScaffold(f"unknown scaffold {name!r}; known: {', '.join(names())}") from None
