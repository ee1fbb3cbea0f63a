"""EXP-Bench's task files read into typed questions, with errors that name the JSON path.

EXP-Bench ships one JSON per paper (``<paper_id>_complete_final.json``) whose ``questions`` list
holds one experiment task each, plus per-conference paper metadata (JSONL lines or a JSON object
with ``code_url`` and ``pdf_url``). A question is one of three kinds:

- ``masked``: ``masked_source`` names repository files that are removed before the participant
  sees the repository (they must re-implement them);
- ``source``: only ``source`` names the files that implement the experiment (nothing removed);
- ``no_code``: neither (the experiment is designed and concluded on the repository as it is).

Only the fields the platform uses are validated; the rest of a question is kept verbatim (it is
stored HIDDEN with the ground truth, so nothing is lost by not modelling it).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTIONS_SUFFIX = "_complete_final.json"


class ExpBenchError(ValueError):
    """A malformed EXP-Bench file; the message names the file and the JSON path."""


class QuestionKind(enum.StrEnum):
    MASKED = "masked"
    SOURCE = "source"
    NO_CODE = "no_code"


@dataclass(frozen=True)
class PaperMeta:
    paper_id: str
    title: str
    code_url: str | None
    pdf_url: str | None


@dataclass(frozen=True)
class Question:
    """One EXP-Bench task; ``raw`` is the question object exactly as read."""

    index: int
    question: str
    method: str
    expected_outcome: str
    variables: tuple[str, ...]  # constant, independent and dependent, as text
    requirements: tuple[str, ...]
    agent_instructions: str
    usage_instructions: str
    source: tuple[str, ...]
    masked_source: tuple[str, ...]
    raw: dict[str, Any]

    @property
    def kind(self) -> QuestionKind:
        if self.masked_source:
            return QuestionKind.MASKED
        if self.source:
            return QuestionKind.SOURCE
        return QuestionKind.NO_CODE


def _text(value: Any, where: str, *, required: bool) -> str:
    if value is None and not required:
        return ""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # EXP-Bench writes some long texts as lists of lines
    if not isinstance(value, str) or (required and not value.strip()):
        raise ExpBenchError(f"{where}: expected a non-empty string, got {type(value).__name__}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if not isinstance(value, list):
        raise ExpBenchError(f"{where}: expected a list, got {type(value).__name__}")
    out: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            out.append(json.dumps(item, sort_keys=True))
        else:
            raise ExpBenchError(f"{where}[{i}]: expected a string, got {type(item).__name__}")
    return tuple(out)


def _paths(value: Any, where: str) -> tuple[str, ...]:
    paths = _strings(value, where)
    for i, path in enumerate(paths):
        parts = Path(path).parts
        if Path(path).is_absolute() or ".." in parts or not parts:
            raise ExpBenchError(f"{where}[{i}]: not a path inside the repository: {path!r}")
    return paths


def _question(obj: Any, index: int, where: str) -> Question:
    if not isinstance(obj, dict):
        raise ExpBenchError(f"{where}: expected an object, got {type(obj).__name__}")
    text = obj.get("question", obj.get("hypothesis"))
    design = obj.get("design_complexity", {})
    if not isinstance(design, dict):
        raise ExpBenchError(f"{where}.design_complexity: expected an object")
    variables: list[str] = []
    for name in ("constant_variables", "independent_variables", "dependent_variables"):
        value = design.get(name)
        if isinstance(value, dict):  # {"variable": [values]} in some papers
            variables += [f"{name}: {json.dumps({k: v})}" for k, v in value.items()]
        else:
            variables += [
                f"{name}: {v}" for v in _strings(value, f"{where}.design_complexity.{name}")
            ]
    return Question(
        index=index,
        question=_text(
            text,
            f"{where}.question" if "hypothesis" not in obj else f"{where}.hypothesis",
            required=True,
        ),
        method=_text(obj.get("method"), f"{where}.method", required=False),
        expected_outcome=_text(
            obj.get("expected_outcome"), f"{where}.expected_outcome", required=True
        ),
        variables=tuple(variables),
        requirements=_strings(obj.get("requirements"), f"{where}.requirements"),
        agent_instructions=_text(
            obj.get("agent_instructions"), f"{where}.agent_instructions", required=False
        ),
        usage_instructions=_text(
            obj.get("usage_instructions"), f"{where}.usage_instructions", required=False
        ),
        source=_paths(obj.get("source"), f"{where}.source"),
        masked_source=_paths(obj.get("masked_source"), f"{where}.masked_source"),
        raw=obj,
    )


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpBenchError(f"{path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ExpBenchError(f"{path}: not valid JSON: {exc}") from exc


def load_questions(path: Path) -> list[Question]:
    """The questions of one ``<paper_id>_complete_final.json``."""
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise ExpBenchError(f"{path}: $.questions: expected a list of questions")
    if not data["questions"]:
        raise ExpBenchError(f"{path}: $.questions: is empty")
    try:
        return [_question(q, i, f"$.questions[{i}]") for i, q in enumerate(data["questions"])]
    except ExpBenchError as exc:
        raise ExpBenchError(f"{path}: {exc}") from exc


def paper_id_of(path: Path) -> str:
    return path.name[: -len(QUESTIONS_SUFFIX)]


def load_paper_meta(path: Path, paper_id: str) -> PaperMeta:
    """The paper's metadata from a JSON object, or the matching line of a per-conference JSONL
    (matched on ``id`` or ``paper_id``)."""
    if path.suffix == ".jsonl":
        entry: Any = None
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ExpBenchError(f"{path}:{number}: not valid JSON: {exc}") from exc
            if isinstance(obj, dict) and str(obj.get("id", obj.get("paper_id"))) == paper_id:
                entry, where = obj, f"{path}:{number}: $"
                break
        if entry is None:
            raise ExpBenchError(f"{path}: no line with id {paper_id!r}")
    else:
        entry, where = _load_json(path), f"{path}: $"
        if not isinstance(entry, dict):
            raise ExpBenchError(f"{where}: expected an object")

    def optional(name: str) -> str | None:
        value = entry.get(name)
        if value is not None and not isinstance(value, str):
            raise ExpBenchError(f"{where}.{name}: expected a string")
        return value

    title = entry.get("title", paper_id)
    if not isinstance(title, str):
        raise ExpBenchError(f"{where}.title: expected a string")
    return PaperMeta(paper_id, title, optional("code_url"), optional("pdf_url"))


def question_from_obj(obj: Any, index: int) -> Question:
    """One question object (as stored with a task's ground truth) read back."""
    return _question(obj, index, f"$.questions[{index}]")
