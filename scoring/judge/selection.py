"""Which of a submission's files a leaf may see, by task category (PaperBench's rules).

Code Development and Code Execution leaves see code, configuration and documentation files;
Result Analysis leaves see only table-like and text files that reproduction created or changed,
and when there is none the leaf scores 0 without a model call; ``Subtree`` leaves see both kinds
(code and documentation, and tables the reproduction produced). ``reproduce.sh`` and
``reproduce.log`` are never candidates: execution and result leaves get them in the prompt anyway,
and the log of a reproduction is not evidence of code.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from scoring.judge.submission import SubmissionView
from scoring.rubric import TaskCategory

CODE_SUFFIXES = frozenset(
    {
        ".py", ".ipynb", ".sh", ".bash", ".r", ".jl", ".m", ".c", ".cc", ".cpp", ".h", ".hpp",
        ".cu", ".cuh", ".js", ".ts", ".java", ".go", ".rs", ".scala", ".lua", ".pl", ".sql",
        ".cfg", ".ini", ".toml", ".yaml", ".yml", ".json", ".txt", ".md", ".rst", ".tex",
    }
)  # fmt: skip
CODE_NAMES = frozenset({"Makefile", "Dockerfile", "requirements.txt", "setup.py", "README"})
TABLE_SUFFIXES = frozenset(
    {
        ".csv", ".tsv", ".psv", ".json", ".jsonl", ".html", ".xml", ".yaml", ".yml", ".toml",
        ".txt", ".md", ".tex", ".log", ".out", ".arff",
    }
)  # fmt: skip
IN_PROMPT = frozenset({"reproduce.sh", "reproduce.log"})


def _suffix(path: str) -> str:
    return PurePosixPath(path).suffix.lower()


def candidate_files(submission: SubmissionView, category: TaskCategory) -> list[str]:
    """The paths a leaf of `category` may be shown, sorted; binary files are never candidates."""
    paths: list[str] = []
    changed = submission.reproduction.changed_files if submission.reproduction else frozenset()
    for path in submission.readable_paths():
        if path in IN_PROMPT:
            continue
        is_code = _suffix(path) in CODE_SUFFIXES or PurePosixPath(path).name in CODE_NAMES
        is_result = path in changed and _suffix(path) in TABLE_SUFFIXES
        if category is TaskCategory.RESULT_ANALYSIS:
            if not is_result:
                continue
        elif category is TaskCategory.SUBTREE:
            if not (is_code or is_result):
                continue
        elif not is_code:
            continue
        if submission.text(path) is None:
            continue
        paths.append(path)
    return paths
