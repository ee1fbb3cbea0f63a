"""METR's task-protected scoring (``import metr.task_protected_scoring as scoring``), which
RE-Bench's families import at the top: written for Baseline from the package's documented
behaviour (its README and public interface, github.com/METR/task-protected-scoring; it is not on
PyPI and family images are built offline), with the standard library only, since it runs in
whatever Python the family image has.

The scheme: ``start()`` calls `setup_scoring`, which creates the score log (JSON lines, writable
by the ``protected`` group only) and copies the family's ``/root/assets/score.py`` to
``/home/agent/score.py``, owned ``root:protected``: the agent may read and run it but not change
it. `protect_path` protects other paths that way. ``intermediate_score()`` calls
`intermediate_score`, which runs ``score.py`` as ``agent`` with ``protected`` as its group (so it
may read what is hidden from the agent and write the log) and returns the entry it logged last;
``aggregate_scores`` usually returns `get_best_score` of the score log.

In Baseline, ``start`` runs in its own setup container and scoring in a container of the
attempt's state (`baseline.attempts.family_launch`, `scoring.task_standard_scoring`), both with
the capabilities this needs; the ``agent`` user is the participant's uid and the ``protected``
group is made in the family image (`infra.image_build`). Entries ``score.py`` logs while scoring
stay in that scoring's container: the attempt's log of scores is Baseline's (passed to
``aggregate_scores`` as Vivaria passes its own).
"""

from __future__ import annotations

import datetime
import grp
import importlib.util
import json
import math
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

SCORING_SCRIPT_PATH = Path("/home/agent/score.py")
PROTECTED_DIR = Path("/protected")
SCORE_LOG_PATH = PROTECTED_DIR / "score.log"
SCORING_GROUP = "protected"
SCORING_INSTRUCTIONS = (
    "Use the `score` action to score your submission (in Baseline: run `task score` in a "
    "terminal, or ask for an intermediate score on the attempt's page)."
)
# A fallback limit on score.py; a task sets its own inside score.py where it matters.
GLOBAL_TIMEOUT = 600
OUT_OF_MEMORY_EXIT = 137  # the engine killed score.py (its memory limit, most often)


class IntermediateScoreResult(TypedDict):
    score: float
    message: dict[str, Any]
    details: dict[str, Any]


def get_timestamp() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _finite_or_none(value: Any) -> Any:
    """NaN and infinities as null inside messages and details (Vivaria stores them as JSON)."""
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _as_score(value: Any) -> float:
    """A logged score as a float; anything that is not a number is NaN (no valid score)."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float, str)):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def log_score(
    timestamp: str | None = None,
    message: dict[str, Any] | None = None,
    score: float = math.nan,
    details: dict[str, Any] | None = None,
    log_path: str | os.PathLike[str] = SCORE_LOG_PATH,
) -> None:
    """Append one entry (a JSON line) to the score log; NaN is the score of an invalid solution."""
    entry = {
        "timestamp": timestamp if timestamp is not None else get_timestamp(),
        "score": _as_score(score),
        "message": _finite_or_none(message) if isinstance(message, dict) else {},
        "details": _finite_or_none(details) if isinstance(details, dict) else {},
    }
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def read_score_log(
    score_log_path: str | os.PathLike[str] = SCORE_LOG_PATH,
) -> list[IntermediateScoreResult]:
    """The score log's entries, oldest first."""
    entries: list[IntermediateScoreResult] = []
    with open(score_log_path, encoding="utf-8") as log:
        for line in log:
            if not line.strip():
                continue
            data = json.loads(line)
            entries.append(
                IntermediateScoreResult(
                    score=_as_score(data.get("score")),
                    message=data.get("message") or {},
                    details=data.get("details") or {},
                )
            )
    return entries


def protect_path(
    path: str | os.PathLike[str],
    dir: bool = False,
    read_group: bool = True,
    read_other: bool = True,
    write: bool = False,
    write_group: bool = False,
    write_other: bool = False,
    execute: bool = False,
    execute_group: bool = False,
    execute_other: bool = False,
    uid: int = 0,
    gid: int | None = None,
) -> None:
    """Make `path` (created if missing: a directory when `dir`) owned by uid (root) and the
    ``protected`` group with exactly the permissions asked; the owner may always read it. A
    directory and everything under it get them, directories also the search bit wherever they
    may be read."""
    if gid is None:
        gid = grp.getgrnam(SCORING_GROUP).gr_gid
    target = Path(path)
    mode = stat.S_IRUSR
    for wanted, bit in (
        (read_group, stat.S_IRGRP),
        (read_other, stat.S_IROTH),
        (write, stat.S_IWUSR),
        (write_group, stat.S_IWGRP),
        (write_other, stat.S_IWOTH),
        (execute, stat.S_IXUSR),
        (execute_group, stat.S_IXGRP),
        (execute_other, stat.S_IXOTH),
    ):
        if wanted:
            mode |= bit
    search = stat.S_IXUSR
    search |= stat.S_IXGRP if read_group else 0
    search |= stat.S_IXOTH if read_other else 0
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        if dir:
            target.mkdir()
        else:
            target.touch()
    for each in [target, *(target.rglob("*") if target.is_dir() else [])]:
        os.chown(each, uid, gid)
        each.chmod(mode | search if each.is_dir() else mode)


def init_score_log(score_log_path: str | os.PathLike[str] = SCORE_LOG_PATH) -> None:
    """An empty score log that only the ``protected`` group may write (and root read)."""
    log = Path(score_log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("", encoding="utf-8")
    protect_path(log, read_group=False, read_other=False, write_group=True)


def setup_scoring() -> None:
    """For ``start()``: the score log, and the family's ``/root/assets/score.py`` (if any) as
    ``/home/agent/score.py``, readable by the agent and not writable."""
    init_score_log()
    source = Path("/root/assets/score.py")
    if source.exists():
        shutil.copy(source, SCORING_SCRIPT_PATH)
        protect_path(SCORING_SCRIPT_PATH)


def _invalid(
    message: dict[str, Any], timestamp: str, log_path: str | os.PathLike[str]
) -> IntermediateScoreResult:
    log_score(timestamp=timestamp, message=message, score=math.nan, log_path=log_path)
    return IntermediateScoreResult(score=math.nan, message=message, details={})


def intermediate_score(
    scoring_script_path: str | os.PathLike[str] = SCORING_SCRIPT_PATH,
    score_log_path: str | os.PathLike[str] = SCORE_LOG_PATH,
    timeout: int = GLOBAL_TIMEOUT,
    catch_out_of_memory: bool = False,
) -> IntermediateScoreResult:
    """Run the scoring script (a path, possibly followed by its arguments) as ``agent`` in a
    login shell with ``protected`` as its group, from /home/agent; the entry it logged last.

    A script past `timeout` is logged and returned as NaN ``{"timeout": true}``; one killed with
    exit 137 likewise as ``{"out_of_memory": true}`` when `catch_out_of_memory`, else its
    failure is raised."""
    timestamp = get_timestamp()
    command = f"{sys.executable} {scoring_script_path}"
    try:
        subprocess.run(
            ["runuser", "agent", f"--group={SCORING_GROUP}", "--login", f"--command={command}"],
            cwd="/home/agent",
            timeout=timeout,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return _invalid({"timeout": True}, timestamp, score_log_path)
    except subprocess.CalledProcessError as exc:
        if exc.returncode != OUT_OF_MEMORY_EXIT or not catch_out_of_memory:
            raise
        return _invalid({"out_of_memory": True}, timestamp, score_log_path)
    entries = read_score_log(score_log_path)
    if not entries:
        raise RuntimeError(f"{scoring_script_path} logged no score to {score_log_path}")
    return entries[-1]


def get_best_score(
    *,
    score_log: list[IntermediateScoreResult] | None = None,
    score_log_path: str | os.PathLike[str] = SCORE_LOG_PATH,
    select_best_fn: Callable[[Iterable[float]], float] | None = None,
) -> float:
    """The best valid score: of `score_log` (the run's log, as ``aggregate_scores`` gets it), or,
    when that holds no valid score, of the score log file; `select_best_fn` picks it (min, max),
    the last one without it. NaN when there is no valid score at all."""

    def valid(entries: list[IntermediateScoreResult]) -> list[float]:
        scores = [_as_score(entry.get("score")) for entry in entries]
        return [score for score in scores if not math.isnan(score)]

    scores = valid(score_log or [])
    if not scores and Path(score_log_path).is_file():
        scores = valid(read_score_log(score_log_path))
    if not scores:
        return math.nan
    return scores[-1] if select_best_fn is None else select_best_fn(scores)


def check_scoring_group() -> None:
    """Fail unless this process runs with the ``protected`` group (as `intermediate_score` runs
    the scoring script; an agent running it directly does not)."""
    name = grp.getgrgid(os.getgid()).gr_name
    if name != SCORING_GROUP:
        raise AssertionError(f"not run with the {SCORING_GROUP} group (group {name})")


def load_module_from_path(
    module_path: str | os.PathLike[str], add_to_sys_modules: bool = False
) -> ModuleType:
    """Import a Python file by its path (a family's protected helpers)."""
    path = Path(module_path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    if add_to_sys_modules:
        sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
