"""EXP-Bench's per-stage LLM judge: monitor, design, implementation, conclusion.

EXP-Bench grades one task with a judge and one execution. The monitor goes first: a participant
who read the paper, used git to recover code, or faked data scores 0 on every stage. Then:

- design: the fraction of ground-truth variables (constant, independent, dependent) the
  participant's design matches;
- implementation: the fraction of ``requirements`` the changes implement, with the files masked
  out of the repository given as the reference;
- conclusion: correct or not against ``expected_outcome``.

Each answer carries an explanation and an error analysis. Per-item verdicts (one per variable or
requirement, by index) rather than a bare percentage, so the number is checkable and a verdict
list of the wrong length is retried as malformed. A stage whose call still fails is *invalid*:
its score is None, never 0.

A stage's cache key is the digest of its exact messages and the judge's answer settings: an
unchanged snapshot asks the same questions, so its grades are reused instead of paid again.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scoring.exp_bench import Question
from scoring.llm import CallRecord, ChatClient, JudgeConfig, LLMError, Tokenizer
from scoring.llm import schema_instructions as _schema_text

CACHE_VERSION = "expbench-judge-v1"

A = TypeVar("A", bound=BaseModel)


class JudgeStage(enum.StrEnum):
    MONITOR = "monitor"
    DESIGN = "design"
    IMPLEMENTATION = "implementation"
    CONCLUSION = "conclusion"


class MonitorAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    read_paper: bool
    used_git: bool
    faked_data: bool
    explanation: str
    error_analysis: str


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    satisfied: bool
    reason: str


class ItemsAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdicts: list[Verdict]
    explanation: str
    error_analysis: str


class ConclusionAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    correct: bool
    explanation: str
    error_analysis: str


@dataclass(frozen=True)
class Submission:
    """What the judge reads of one snapshot."""

    answer: str  # exp_bench_answer.json as written ("" when missing)
    diff: str  # the snapshot against the starting repository, the answer file left out
    files: tuple[str, ...]  # the snapshot's paths
    originals: Mapping[str, str]  # the masked files, the implementation's reference
    log: str = ""  # reproduce.log of the execution, when there was one
    activity: str = ""  # requests and agent tool calls up to the snapshot, one a line


@dataclass
class StageResult:
    stage: str
    score: float | None
    valid: bool
    explanation: str = ""
    error_analysis: str = ""
    error: str | None = None
    cache_key: str | None = None
    cached: bool = False
    details: dict[str, Any] = field(default_factory=dict)


CacheLookup = Callable[[str], StageResult | None]
OnCall = Callable[[CallRecord, str], None]

_SYSTEM = (
    "You grade one EXP-Bench experiment task done by a participant (a person or an AI agent) "
    "on a paper's code repository. Be strict and literal; judge only from what is shown."
)


def _budget(config: JudgeConfig) -> int:
    return config.file_token_budget or max(2_000, config.context_tokens // 2)


def _clip(text: str, tokens: int, tokenizer: Tokenizer) -> str:
    head = tokenizer.head(text, tokens)
    return head if head == text else head + "\n[... truncated ...]"


def _messages(task: str, body: str, schema: type[BaseModel]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": f"{task}\n\n{body}\n\n{_schema_text(schema)}"},
    ]


def _key(stage: str, config: JudgeConfig, messages: list[dict[str, str]]) -> str:
    text = json.dumps(
        [CACHE_VERSION, stage, config.settings_digest(), messages], separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _numbered(items: tuple[str, ...]) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items))


def _check_items(count: int) -> Callable[[ItemsAnswer], str | None]:
    def check(answer: ItemsAnswer) -> str | None:
        got = sorted(v.index for v in answer.verdicts)
        if got != list(range(count)):
            return f"expected one verdict for each index 0..{count - 1}, got {got}"
        return None

    return check


def diff_chunks(diff: str, budget: int, tokenizer: Tokenizer) -> list[str]:
    """The diff cut into parts of at most `budget` tokens, at file boundaries where possible
    (a file larger than the budget is cut between lines)."""
    sections: list[str] = []
    for line in diff.splitlines(keepends=True):
        if not sections or line.startswith(("--- ", "Binary file ")):
            sections.append(line)
        else:
            sections[-1] += line
    chunks: list[str] = []
    current, used = "", 0
    for section in sections:
        pieces = [section]
        if tokenizer.count(section) > budget:
            pieces, piece, piece_used = [], "", 0
            for line in section.splitlines(keepends=True):
                line = tokenizer.head(line, budget)
                count = tokenizer.count(line)
                if piece and piece_used + count > budget:
                    pieces.append(piece)
                    piece, piece_used = "", 0
                piece, piece_used = piece + line, piece_used + count
            pieces.append(piece)
        for piece in pieces:
            size = tokenizer.count(piece)
            if current and used + size > budget:
                chunks.append(current)
                current, used = "", 0
            current, used = current + piece, used + size
    if current or not chunks:
        chunks.append(current)
    return chunks


@dataclass
class ExpBenchJudge:
    """Grades the judged stages of one snapshot; `client` is the judge's model client."""

    config: JudgeConfig
    client: ChatClient

    def stages_for(self, question: Question) -> list[JudgeStage]:
        """The stages that apply: no variables, no design stage; no requirements, no
        implementation stage (EXP-Bench's tasks without code)."""
        stages = [JudgeStage.MONITOR]
        if question.variables:
            stages.append(JudgeStage.DESIGN)
        if question.requirements:
            stages.append(JudgeStage.IMPLEMENTATION)
        stages.append(JudgeStage.CONCLUSION)
        return stages

    def grade(
        self,
        question: Question,
        submission: Submission,
        *,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> list[StageResult]:
        tokenizer = Tokenizer(self.config.encoding)
        budget = _budget(self.config)
        diff = _clip(submission.diff or "(no changes)", budget, tokenizer)
        answer = _clip(submission.answer or "(no answer file)", budget // 4, tokenizer)
        task = (
            f"Question:\n{question.question}\n\nMethod given to the participant:\n"
            f"{question.method or '(none)'}"
        )
        results: list[StageResult] = []
        monitor = self._ask(
            JudgeStage.MONITOR,
            _messages(
                "Monitor the participant. They were forbidden to read the paper, to use git "
                "(history, remotes, other branches) to recover code, and to fake data or "
                "results (hard-coded numbers, fabricated logs). Decide for each.",
                f"{task}\n\nFiles in the submission:\n"
                + "\n".join(submission.files)
                + f"\n\nChanges made (diff):\n{diff}\n\nParticipant's answer:\n{answer}"
                + "\n\nExecution log:\n"
                + _clip(submission.log or "(none)", budget // 4, tokenizer)
                + "\n\nActivity (outbound requests, agent tool calls):\n"
                + _clip(submission.activity or "(none recorded)", budget // 4, tokenizer),
                MonitorAnswer,
            ),
            MonitorAnswer,
            lambda a: 0.0 if (a.read_paper or a.used_git or a.faked_data) else 1.0,
            cached,
            on_call,
        )
        results.append(monitor)
        flagged = monitor.valid and monitor.score == 0.0
        for stage in self.stages_for(question)[1:]:
            if flagged:
                results.append(
                    StageResult(
                        stage=stage.value,
                        score=0.0,
                        valid=True,
                        explanation="the monitor flagged a violation: every stage scores 0",
                        error_analysis=monitor.error_analysis,
                    )
                )
                continue
            results.append(self._stage(stage, question, task, answer, submission, cached, on_call))
        return results

    def _stage(
        self,
        stage: JudgeStage,
        question: Question,
        task: str,
        answer: str,
        submission: Submission,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> StageResult:
        if stage is JudgeStage.DESIGN:
            items = question.variables
            return self._ask(
                stage,
                _messages(
                    "Compare the participant's experimental design with the ground-truth "
                    "variables. For each ground-truth variable (by index) say whether the "
                    "participant's design matches it.",
                    f"{task}\n\nGround-truth variables:\n{_numbered(items)}\n\n"
                    f"Participant's answer (design and conclusion):\n{answer}",
                    ItemsAnswer,
                ),
                ItemsAnswer,
                lambda a: sum(v.satisfied for v in a.verdicts) / len(items),
                cached,
                on_call,
                _check_items(len(items)),
            )
        if stage is JudgeStage.IMPLEMENTATION:
            return self._implementation(question, task, submission, cached, on_call)
        return self._ask(
            stage,
            _messages(
                "Decide whether the participant's conclusion agrees with the expected outcome.",
                f"{task}\n\nExpected outcome:\n{question.expected_outcome}\n\n"
                f"Participant's answer (design and conclusion):\n{answer}",
                ConclusionAnswer,
            ),
            ConclusionAnswer,
            lambda a: 1.0 if a.correct else 0.0,
            cached,
            on_call,
        )

    def _implementation(
        self,
        question: Question,
        task: str,
        submission: Submission,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> StageResult:
        """Requirements judged against the diff, in chunks when it is larger than the file
        budget (EXP-Bench does the same): a requirement counts as implemented when some chunk
        implements it. The chunks' answers are one grade with one cache key."""
        stage, items = JudgeStage.IMPLEMENTATION, question.requirements
        tokenizer = Tokenizer(self.config.encoding)
        reference = "\n\n".join(
            f"--- original {path} ---\n{text}"
            for path, text in sorted(submission.originals.items())
        )
        reference = _clip(reference or "(none removed)", _budget(self.config) // 2, tokenizer)
        chunks = diff_chunks(submission.diff or "(no changes)", _budget(self.config), tokenizer)
        prompts = [
            _messages(
                "Decide, for each implementation requirement (by index), whether the "
                "participant's changes implement it correctly. The original files that were "
                "removed from the repository are given as the reference implementation."
                + (
                    f" The changes are shown in {len(chunks)} parts; this is part {n + 1}: "
                    "judge only what this part shows."
                    if len(chunks) > 1
                    else ""
                ),
                f"{task}\n\nRequirements:\n{_numbered(items)}\n\nReference files:\n{reference}"
                f"\n\nParticipant's changes (diff against the starting repository):\n{chunk}",
                ItemsAnswer,
            )
            for n, chunk in enumerate(chunks)
        ]
        key = _key(stage.value, self.config, [m for prompt in prompts for m in prompt])
        hit = cached(key)
        if hit is not None:
            hit.cached = True
            return hit
        satisfied = [False] * len(items)
        explanations: list[str] = []
        analyses: list[str] = []
        answers: list[dict[str, Any]] = []
        for prompt in prompts:
            try:
                parsed = self.client.parse(
                    prompt,
                    ItemsAnswer,
                    purpose=f"expbench_{stage.value}",
                    check=_check_items(len(items)),
                )
            except LLMError as exc:
                for call in exc.calls:
                    on_call(call, stage.value)
                return StageResult(stage.value, None, False, error=str(exc)[:2000], cache_key=key)
            for call in parsed.calls:
                on_call(call, stage.value)
            for verdict in parsed.value.verdicts:
                satisfied[verdict.index] = satisfied[verdict.index] or verdict.satisfied
            explanations.append(parsed.value.explanation)
            analyses.append(parsed.value.error_analysis)
            answers.append(parsed.value.model_dump(mode="json"))
        joined = "\n".join if len(prompts) > 1 else "".join
        return StageResult(
            stage=stage.value,
            score=sum(satisfied) / len(items),
            valid=True,
            explanation=joined(explanations),
            error_analysis=joined(a for a in analyses if a),
            cache_key=key,
            details={"answer": answers[0] if len(answers) == 1 else answers, "chunks": len(chunks)},
        )

    def _ask(
        self,
        stage: JudgeStage,
        messages: list[dict[str, str]],
        schema: type[A],
        score: Callable[[A], float],
        cached: CacheLookup,
        on_call: OnCall,
        check: Callable[[A], str | None] | None = None,
    ) -> StageResult:
        key = _key(stage.value, self.config, messages)
        hit = cached(key)
        if hit is not None:
            hit.cached = True
            return hit
        try:
            parsed = self.client.parse(
                messages, schema, purpose=f"expbench_{stage.value}", check=check
            )
        except LLMError as exc:
            for call in exc.calls:
                on_call(call, stage.value)
            return StageResult(stage.value, None, False, error=str(exc)[:2000], cache_key=key)
        for call in parsed.calls:
            on_call(call, stage.value)
        value = parsed.value
        return StageResult(
            stage=stage.value,
            score=score(value),
            valid=True,
            explanation=str(getattr(value, "explanation", "")),
            error_analysis=str(getattr(value, "error_analysis", "")),
            cache_key=key,
            details={"answer": value.model_dump(mode="json")},
        )


class AllPassedPolicy(BaseModel):
    """When a task counts as fully solved. EXP-Bench reports "all stages passed" without
    publishing how stages are combined, so the rule is explicit and stored with each grading.

    Default: the monitor found no violation, and every listed stage *that applies to the task*
    (a task without code has no implementation stage) scored at least `threshold`. Undetermined
    (None) while any of those stages is invalid or missing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: tuple[str, ...] = ("design", "implementation", "execution", "conclusion")
    threshold: float = Field(default=1.0, ge=0.0, le=1.0)
    require_monitor: bool = True

    @field_validator("stages")
    @classmethod
    def _known_stages(cls, stages: tuple[str, ...]) -> tuple[str, ...]:
        known = {s.value for s in JudgeStage} | {"execution"}
        unknown = sorted(set(stages) - known)
        if unknown or not stages:
            raise ValueError(f"stages must be some of {', '.join(sorted(known))}; got {unknown}")
        return stages

    def describe(self) -> str:
        required = (["monitor clean"] if self.require_monitor else []) + [
            f"{s} >= {self.threshold:g}" for s in self.stages
        ]
        return " and ".join(required) + " (stages a task lacks are not required)"

    def evaluate(self, scores: Mapping[str, float | None], applicable: set[str]) -> float | None:
        wanted = [s for s in self.stages if s in applicable]
        if self.require_monitor:
            wanted.insert(0, JudgeStage.MONITOR.value)
        values = [scores.get(s) for s in wanted]
        if any(v is not None and v < self.threshold for v in values):
            return 0.0
        if any(v is None for v in values):
            return None
        return 1.0
