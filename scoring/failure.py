"""Why a reproduction failed, in the EXP-Bench taxonomy, from its exit code and its log.

EXP-Bench found that complete experiments fail mostly for environment/dependency problems and
script-level errors; a study needs the same split for humans and agents, computed the same way.
The class is decided by a small ordered rule table: the first rule that matches wins, so more
specific causes (the script is missing, a time-out, memory, the GPU) are tried before the generic
ones (a dependency, then any script error). Only the tail of a log is searched: the cause of a
failure is printed last, and a long log must not make classification slow.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

# How much of the end of the log the rules read.
TAIL_CHARS = 64 * 1024


class FailureClass(enum.StrEnum):
    MISSING_REPRODUCE_SH = "missing_reproduce_sh"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out_of_memory"
    GPU_UNAVAILABLE = "gpu_unavailable"
    ENVIRONMENT = "environment"  # environment or dependency error
    SCRIPT_ERROR = "script_error"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    FailureClass.MISSING_REPRODUCE_SH: "missing reproduce.sh",
    FailureClass.TIMEOUT: "time-out",
    FailureClass.OUT_OF_MEMORY: "out of memory",
    FailureClass.GPU_UNAVAILABLE: "GPU unavailable",
    FailureClass.ENVIRONMENT: "environment or dependency error",
    FailureClass.SCRIPT_ERROR: "script error",
}


@dataclass(frozen=True)
class RunFacts:
    """What is known about one run of reproduce.sh."""

    reproduce_sh_present: bool
    exit_code: int | None
    timed_out: bool
    log: str = ""
    # The workspace's process limit was reached during the run (a fork bomb): a failure even
    # when the script exited 0 (its processes were killed, `scoring.guarded_run`).
    process_limit_reached: bool = False


@dataclass(frozen=True)
class Classification:
    failure: FailureClass
    rule: str  # the name of the rule that matched, for the record
    evidence: str  # the matched log line (or the fact) that decided it


def _pattern(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE | re.MULTILINE)


OOM_LOG = _pattern(
    r"\bCUDA out of memory\b",
    r"\bOutOfMemoryError\b",
    r"^\s*MemoryError\b",
    r"\bCannot allocate memory\b",
    r"\bstd::bad_alloc\b",
    r"\boom-kill",
    r"^Killed\s*$",
    r"line \d+:\s+\d+ Killed\b",  # bash reporting a child killed by SIGKILL
    r"\bRESOURCE_EXHAUSTED\b",
)
GPU_LOG = _pattern(
    r"No CUDA GPUs are available",
    r"Found no NVIDIA driver",
    r"NVIDIA driver on your system is too old",
    r"CUDA driver version is insufficient",
    r"Torch not compiled with CUDA enabled",
    r"nvidia-smi: (?:command )?not found",
    r"NVIDIA-SMI has failed",
    r"no CUDA-capable device is detected",
    r"CUDA error: no kernel image is available",
    r"cudaGetDeviceCount\(\) returned",
    r"Attempting to deserialize object on a CUDA device but torch\.cuda\.is_available\(\) is False",
)
ENVIRONMENT_LOG = _pattern(
    r"\bModuleNotFoundError\b",
    r"\bImportError\b",
    r"No module named ",
    r"ERROR: Could not find a version that satisfies",
    r"ERROR: No matching distribution found",
    r"ERROR: ResolutionImpossible",
    r"Failed building wheel",
    r"error: externally-managed-environment",
    r"\bPackagesNotFoundError\b",
    r"\bcommand not found\b",
    r"No such file or directory: '?(?:python|pip|conda)",
    r"Could not resolve host",
    r"Temporary failure in name resolution",
    r"\bNameResolutionError\b",
    r"Failed to establish a new connection",
    r"\bversion `GLIBC",
    r"\bundefined symbol:",
    r"cannot open shared object file",
    r"requires a different Python",
)
SCRIPT_LOG = _pattern(
    r"^Traceback \(most recent call last\)",
    r"^\s*[\w.]*(?:Error|Exception): ",
    r"\bSyntaxError\b",
    r"\bSegmentation fault\b",
)

Rule = Callable[[RunFacts, str], str | None]


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    """The last matching line: in a log the decisive error is usually the last one."""
    found = None
    for match in pattern.finditer(text):
        found = match
    if found is None:
        return None
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.end())
    return text[start : end if end >= 0 else len(text)].strip()[:500]


def _missing(facts: RunFacts, _tail: str) -> str | None:
    return None if facts.reproduce_sh_present else "no reproduce.sh at the top of the submission"


def _timeout(facts: RunFacts, _tail: str) -> str | None:
    return "the run was stopped at the time limit" if facts.timed_out else None


def _process_limit(facts: RunFacts, _tail: str) -> str | None:
    if facts.process_limit_reached:
        return "the workspace's process limit was reached during the run"
    return None


def _oom(facts: RunFacts, tail: str) -> str | None:
    line = _last_match(OOM_LOG, tail)
    if line is not None:
        return line
    # SIGKILL (128 + 9) that is not our time-out is the kernel's OOM killer in a memory-capped box.
    if facts.exit_code == 137:
        return "exit code 137 (killed by SIGKILL) before the time limit"
    return None


def _log_rule(pattern: re.Pattern[str]) -> Rule:
    def rule(_facts: RunFacts, tail: str) -> str | None:
        return _last_match(pattern, tail)

    return rule


def _exit_127(facts: RunFacts, _tail: str) -> str | None:
    return "exit code 127: a command was not found" if facts.exit_code == 127 else None


def _any_failure(facts: RunFacts, tail: str) -> str | None:
    line = _last_match(SCRIPT_LOG, tail)
    return line or f"exit code {facts.exit_code}"


# The ordered rule table: (name, class, rule). The first match wins.
RULES: tuple[tuple[str, FailureClass, Rule], ...] = (
    ("missing-script", FailureClass.MISSING_REPRODUCE_SH, _missing),
    ("time-limit", FailureClass.TIMEOUT, _timeout),
    ("process-limit", FailureClass.SCRIPT_ERROR, _process_limit),
    ("out-of-memory", FailureClass.OUT_OF_MEMORY, _oom),
    ("gpu-log", FailureClass.GPU_UNAVAILABLE, _log_rule(GPU_LOG)),
    ("dependency-log", FailureClass.ENVIRONMENT, _log_rule(ENVIRONMENT_LOG)),
    ("command-not-found", FailureClass.ENVIRONMENT, _exit_127),
    ("script-error", FailureClass.SCRIPT_ERROR, _any_failure),
)


def classify(facts: RunFacts) -> Classification | None:
    """The failure class of a run, or None when it succeeded (reproduce.sh exited 0 within the
    limits)."""
    clean = not facts.timed_out and not facts.process_limit_reached
    if facts.reproduce_sh_present and clean and facts.exit_code == 0:
        return None
    tail = facts.log[-TAIL_CHARS:]
    for name, failure, rule in RULES:
        evidence = rule(facts, tail)
        if evidence is not None:
            return Classification(failure=failure, rule=name, evidence=evidence)
    raise AssertionError("the last rule matches every failed run")  # pragma: no cover
