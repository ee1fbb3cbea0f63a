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

Every text the judge reads is bounded before it is tokenised: cut to a number of characters
proportional to its token budget, then to the budget itself (a masked notebook of 442 KB or a
results file of 1.35 MB is never handed to the tokenizer whole), and each cut is recorded in the
details of the stages that read the text. A large diff is judged in at most 15 parts, EXP-Bench's
limit. A stage that fails in any way is invalid rather than the grading's failure, so the calls
already paid for, recorded through ``on_call`` in the caller's transaction, are kept.

The monitor goes first and decides alone, as in EXP-Bench: an answer that cannot be read counts as
a violation (EXP-Bench's parse-error default), a call that could not be made leaves it invalid.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
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


# A text is cut to this many characters per token of its budget before it is tokenised: more
# than ordinary text spends on a token, so the token budget still decides what is kept, while no
# text of any size reaches the tokenizer larger than that.
CHARS_PER_TOKEN = 8
# EXP-Bench judges a large diff in parts and stops at the 15th ("set this as a break point").
MAX_DIFF_PARTS = 15


def _budget(config: JudgeConfig) -> int:
    return config.file_token_budget or max(2_000, config.context_tokens // 2)


def bounded_head(text: str, tokens: int, tokenizer: Tokenizer) -> str:
    """The longest prefix of `text` of at most `tokens` tokens among its first
    ``tokens * CHARS_PER_TOKEN`` characters: only that much of it is ever tokenised."""
    return tokenizer.head(text[: tokens * CHARS_PER_TOKEN], tokens)


def _cut_note(kept: int, total: int) -> str:
    return f"\n[... cut: the first {kept:,} of {total:,} characters are shown ...]"


@dataclass
class _Shown:
    """The texts the judge is shown, each bounded (:func:`bounded_head`) and its cut recorded by
    name: characters, characters kept, token budget."""

    tokenizer: Tokenizer
    cuts: dict[str, dict[str, int]] = field(default_factory=dict)

    def text(self, name: str, text: str, tokens: int) -> str:
        kept = bounded_head(text, tokens, self.tokenizer)
        if kept == text:
            return text
        self.cuts[name] = {"chars": len(text), "kept_chars": len(kept), "budget_tokens": tokens}
        return kept + _cut_note(len(kept), len(text))

    def items(self, name: str, items: tuple[str, ...], tokens: int) -> tuple[str, ...]:
        return tuple(self.text(f"{name}[{i}]", item, tokens) for i, item in enumerate(items))

    def of(self, *prefixes: str) -> dict[str, dict[str, int]]:
        """The cuts of the texts whose names start with one of `prefixes`."""
        return {n: c for n, c in self.cuts.items() if n.startswith(prefixes)}


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
    (a file larger than the budget is cut between lines, a line larger than it cut short). No
    text longer than ``budget * CHARS_PER_TOKEN`` characters is tokenised."""
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
        if len(section) > budget * CHARS_PER_TOKEN or tokenizer.count(section) > budget:
            pieces, piece, piece_used = [], "", 0
            for line in section.splitlines(keepends=True):
                line = bounded_head(line, budget, tokenizer)
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
        """Every stage's grade; this never raises for a stage's failure (see the module)."""
        budget = _budget(self.config)
        shown = _Shown(Tokenizer(self.config.encoding))
        diff = shown.text("diff", submission.diff or "(no changes)", budget)
        answer = shown.text("answer", submission.answer or "(no answer file)", budget // 4)
        task = (
            f"Question:\n{shown.text('question', question.question, budget // 8)}\n\n"
            "Method given to the participant:\n"
            f"{shown.text('method', question.method, budget // 8) or '(none)'}"
        )
        files = shown.text("files", "\n".join(submission.files), budget // 8)
        log = shown.text("log", submission.log or "(none)", budget // 4)
        activity = shown.text("activity", submission.activity or "(none recorded)", budget // 4)
        monitor = self._safely(
            JudgeStage.MONITOR,
            lambda: self._monitor(
                _messages(
                    "Monitor the participant. They were forbidden to read the paper, to use git "
                    "(history, remotes, other branches) to recover code, and to fake data or "
                    "results (hard-coded numbers, fabricated logs). Decide for each.",
                    f"{task}\n\nFiles in the submission:\n{files}"
                    f"\n\nChanges made (diff):\n{diff}\n\nParticipant's answer:\n{answer}"
                    f"\n\nExecution log:\n{log}"
                    f"\n\nActivity (outbound requests, agent tool calls):\n{activity}",
                    MonitorAnswer,
                ),
                cached,
                on_call,
            ),
        )
        _note_cuts(
            monitor, shown.of("question", "method", "files", "diff", "answer", "log", "activity")
        )
        results = [monitor]
        for stage in self.stages_for(question)[1:]:
            if flagged(monitor):
                results.append(zeroed(stage.value, monitor))
                continue
            grade = partial(
                self._stage, stage, question, task, answer, submission, shown, cached, on_call
            )
            results.append(self._safely(stage, grade))
        return results

    def _safely(self, stage: JudgeStage, grade: Callable[[], StageResult]) -> StageResult:
        """The stage's grade, or an invalid one when grading it failed in any way: the calls
        made so far (this stage's and earlier ones') are recorded in the caller's transaction,
        which a raised exception would roll back, losing calls already paid for."""
        try:
            return grade()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:2000]
            return StageResult(stage.value, None, False, error=error)

    def _monitor(
        self, messages: list[dict[str, str]], cached: CacheLookup, on_call: OnCall
    ) -> StageResult:
        """The monitor's grade. An answer still unreadable after the allowed attempts is a
        violation, as EXP-Bench counts its parse-error default; a call that could not be made
        (transport, refusal of the request) leaves the monitor invalid."""
        result = self._ask(
            JudgeStage.MONITOR,
            messages,
            MonitorAnswer,
            lambda a: 0.0 if (a.read_paper or a.used_git or a.faked_data) else 1.0,
            cached,
            on_call,
        )
        if result.valid or not result.details.get("unreadable"):
            return result
        return StageResult(
            stage=result.stage,
            score=0.0,
            valid=True,
            explanation="the monitor's answer could not be read: counted as a violation, as "
            "EXP-Bench counts it",
            error_analysis=result.error or "",
            details=result.details,  # no cache key: a later grading asks again
        )

    def _stage(
        self,
        stage: JudgeStage,
        question: Question,
        task: str,
        answer: str,
        submission: Submission,
        shown: _Shown,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> StageResult:
        budget = _budget(self.config)
        if stage is JudgeStage.DESIGN:
            items = shown.items("variables", question.variables, budget // 8)
            result = self._ask(
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
            return _note_cuts(result, shown.of("question", "method", "answer", "variables"))
        if stage is JudgeStage.IMPLEMENTATION:
            return self._implementation(question, task, submission, shown, cached, on_call)
        expected = shown.text("expected_outcome", question.expected_outcome, budget // 8)
        result = self._ask(
            stage,
            _messages(
                "Decide whether the participant's conclusion agrees with the expected outcome.",
                f"{task}\n\nExpected outcome:\n{expected}\n\n"
                f"Participant's answer (design and conclusion):\n{answer}",
                ConclusionAnswer,
            ),
            ConclusionAnswer,
            lambda a: 1.0 if a.correct else 0.0,
            cached,
            on_call,
        )
        return _note_cuts(result, shown.of("question", "method", "answer", "expected_outcome"))

    def _implementation(
        self,
        question: Question,
        task: str,
        submission: Submission,
        shown: _Shown,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> StageResult:
        """Requirements judged against the diff, in chunks when it is larger than the file
        budget (EXP-Bench does the same, up to its 15 parts): a requirement counts as implemented
        when some chunk implements it. The chunks' answers are one grade with one cache key."""
        stage, budget = JudgeStage.IMPLEMENTATION, _budget(self.config)
        items = shown.items("requirements", question.requirements, budget // 8)
        reference = "\n\n".join(
            f"--- original {path} ---\n{text}"
            for path, text in sorted(submission.originals.items())
        )
        reference = shown.text("reference", reference or "(none removed)", budget // 2)
        whole = submission.diff or "(no changes)"
        # At most the parts EXP-Bench judges are cut from the diff: the rest is never tokenised.
        diff = whole[: MAX_DIFF_PARTS * budget * CHARS_PER_TOKEN]
        chunks = diff_chunks(diff, budget, shown.tokenizer)
        judged = chunks[:MAX_DIFF_PARTS]
        kept = sum(len(c) for c in judged)
        if len(chunks) > MAX_DIFF_PARTS or len(diff) < len(whole):
            shown.cuts["diff (implementation)"] = {
                "chars": len(whole),
                "kept_chars": kept,
                "budget_tokens": budget,
                "parts": len(judged),
            }
            judged[-1] += _cut_note(kept, len(whole))
        prompts = [
            _messages(
                "Decide, for each implementation requirement (by index), whether the "
                "participant's changes implement it correctly. The original files that were "
                "removed from the repository are given as the reference implementation."
                + (
                    f" The changes are shown in {len(judged)} parts; this is part {n + 1}: "
                    "judge only what this part shows."
                    if len(judged) > 1
                    else ""
                ),
                f"{task}\n\nRequirements:\n{_numbered(items)}\n\nReference files:\n{reference}"
                f"\n\nParticipant's changes (diff against the starting repository):\n{chunk}",
                ItemsAnswer,
            )
            for n, chunk in enumerate(judged)
        ]
        cuts = shown.of("question", "method", "requirements", "reference", "diff (")
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
                failed = StageResult(stage.value, None, False, error=str(exc)[:2000], cache_key=key)
                return _note_cuts(failed, cuts)
            for call in parsed.calls:
                on_call(call, stage.value)
            for verdict in parsed.value.verdicts:
                satisfied[verdict.index] = satisfied[verdict.index] or verdict.satisfied
            explanations.append(parsed.value.explanation)
            analyses.append(parsed.value.error_analysis)
            answers.append(parsed.value.model_dump(mode="json"))
        joined = "\n".join if len(prompts) > 1 else "".join
        result = StageResult(
            stage=stage.value,
            score=sum(satisfied) / len(items),
            valid=True,
            explanation=joined(explanations),
            error_analysis=joined(a for a in analyses if a),
            cache_key=key,
            details={"answer": answers[0] if len(answers) == 1 else answers, "chunks": len(judged)},
        )
        return _note_cuts(result, cuts)

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
            return StageResult(
                stage.value,
                None,
                False,
                error=str(exc)[:2000],
                cache_key=key,
                details={"unreadable": True} if _unreadable(exc) else {},
            )
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


def flagged(monitor: StageResult) -> bool:
    """Whether the monitor found a violation (an unreadable answer included)."""
    return monitor.valid and monitor.score == 0.0


def zeroed(stage: str, monitor: StageResult) -> StageResult:
    """A stage after a monitor violation: 0 without being graded, as EXP-Bench skips every
    stage then (the execution check included)."""
    return StageResult(
        stage=stage,
        score=0.0,
        valid=True,
        explanation="the monitor flagged a violation: every stage scores 0",
        error_analysis=monitor.error_analysis,
    )


# How the model client describes an answer it got but could not use (scoring.llm's _Malformed).
_UNREADABLE = ("unparseable answer", "unusable answer", "no parsed answer")


def _unreadable(exc: LLMError) -> bool:
    """Whether the model answered every time but never readably (its last try an answer that
    could not be parsed), as opposed to calls that could not be made."""
    return bool(exc.calls) and not exc.fatal and (exc.calls[-1].error or "").startswith(_UNREADABLE)


def _note_cuts(result: StageResult, cuts: dict[str, dict[str, int]]) -> StageResult:
    """The stage's result with what was cut of the texts it read (none: unchanged). A cached
    grade was asked with the same texts, so the same cuts."""
    if cuts and not result.cached:
        result.details = {**result.details, "cut": cuts}
    return result


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
