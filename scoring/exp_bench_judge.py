"""EXP-Bench's per-stage LLM judge: monitor, design and conclusion, implementation.

EXP-Bench grades one task with a judge and one execution, and this module asks what its judge
asks (``evaluation/judge.py`` and its prompts in Just-Curieous/Curie, rewritten here, not copied).
The monitor goes first and decides alone: a participant who read the paper, used git, or faked
data scores 0 on every stage, an answer that cannot be read counting as a violation (EXP-Bench's
parse-error default) and a call that could not be made leaving it invalid. Then:

- design and conclusion, in one call as EXP-Bench makes it: the participant's ``design`` against
  the question's whole ``design_complexity`` (nested or not) as an integer percentage, and the
  ``conclusion`` correct or not against ``expected_outcome``;
- implementation (EXP-Bench's setup): the diff against the ``requirements`` or, for a question
  without them (no code), against its ``method``, as an integer percentage, with the removed
  files as the reference scripts. A large diff is judged in parts in sequence, each part's
  prompt carrying the previous part's evaluation, the last answer being the grade, and at most
  15 parts (EXP-Bench's break point).

Every stage applies to every question, as in EXP-Bench: none is dropped for want of variables or
requirements. Each answer carries an explanation and an error analysis. A stage whose call still
fails is *invalid*: its score is None, never 0 (EXP-Bench would record its default answer).

A stage's cache key is the digest of its exact messages and the judge's answer settings: an
unchanged snapshot asks the same questions, so its grades are reused instead of paid again.

Every text the judge reads is bounded before it is tokenised: cut to a number of characters
proportional to its token budget, then to the budget itself (a masked notebook of 442 KB or a
results file of 1.35 MB is never handed to the tokenizer whole), and each cut is recorded in the
details of the stages that read the text. A stage that fails in any way is invalid rather than
the grading's failure, so the calls already paid for, recorded through ``on_call`` in the
caller's transaction, are kept. The one way out before every stage is graded is the caller's
``should_stop`` (a runner that gave its run up): `GradingStopped`, raised before the next call.
Where this differs from EXP-Bench on purpose, the difference is named in
``scoring/EXP_BENCH.md``.
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
from scoring.llm import CallRecord, ChatClient, JudgeConfig, LLMError, Parsed, Tokenizer
from scoring.llm import schema_instructions as _schema_text

CACHE_VERSION = "expbench-judge-v2"

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


class DesignConclusionAnswer(BaseModel):
    """EXP-Bench's one judgement of design and conclusion."""

    model_config = ConfigDict(extra="forbid")

    design_score: int = Field(ge=0, le=100)  # percent of the ground-truth design matched
    design_explanation: str
    design_error_analysis: str
    conclusion_correct: bool
    conclusion_explanation: str
    conclusion_error_analysis: str


class SetupAnswer(BaseModel):
    """EXP-Bench's setup judgement: the percent of the requirements the diff implements."""

    model_config = ConfigDict(extra="forbid")

    score: int = Field(ge=0, le=100)
    explanation: str
    error_analysis: str


@dataclass(frozen=True)
class Submission:
    """What the judge reads of one snapshot."""

    answer: str  # exp_bench_answer.json as written ("" when missing)
    diff: str  # the snapshot against the starting repository, the answer file left out
    files: tuple[str, ...]  # the snapshot's paths
    originals: Mapping[str, str]  # the removed files, the implementation's reference scripts
    log: str = ""  # reproduce.log of the execution, when there was one
    activity: str = ""  # requests, commands and agent tool calls up to the snapshot, one a line


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
ShouldStop = Callable[[], bool]


def _never() -> bool:
    return False


class GradingStopped(Exception):
    """The caller's `should_stop` said to stop before a model call: the grading ends at once,
    with no result. Not a stage's failure, so it passes through what makes those invalid (which
    catches every exception): a runner that gave its run up (its claim lost) could not stop the
    judge, and paid for every later stage all the same."""


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
NO_ANSWER = "(no answer: the participant wrote no exp_bench_answer.json with design and conclusion)"


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


def _stage_key(key: str, stage: JudgeStage) -> str:
    """The cache key of one stage of a call that grades two (design and conclusion)."""
    return hashlib.sha256(f"{key}:{stage.value}".encode()).hexdigest()


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False)


def answer_parts(answer: str) -> tuple[str, str]:
    """The participant's design and conclusion. EXP-Bench takes them from its answer JSON's
    ``design`` and ``conclusion``; an answer without them is its ``no_answer`` case, graded with
    the same text as both (here the file as written, or a note that there is none)."""
    try:
        parsed = json.loads(answer) if answer.strip() else None
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and "design" in parsed and "conclusion" in parsed:
        return _as_text(parsed["design"]), _as_text(parsed["conclusion"])
    text = answer if answer.strip() else NO_ANSWER
    return text, text


def setup_ground_truth(question: Question) -> str:
    """What the implementation is judged against, as EXP-Bench chooses it: the ``requirements``
    when the question has them, else its ``method`` (the questions without code)."""
    if "requirements" in question.raw:
        return "\n".join(f"- {r}" for r in question.requirements) or "(none listed)"
    return question.method or "(none)"


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
    # Asked before each model call; True ends the grading with `GradingStopped`.
    should_stop: ShouldStop = _never

    def grade(
        self,
        question: Question,
        submission: Submission,
        *,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> list[StageResult]:
        """Every stage's grade (monitor, design, implementation, conclusion); this never raises
        for a stage's failure (see the module), only `GradingStopped` when `should_stop` said
        so (the calls made until then recorded through `on_call`)."""
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
                    "\n\nActivity (outbound requests, commands, agent tool calls):"
                    f"\n{activity}",
                    MonitorAnswer,
                ),
                cached,
                on_call,
            ),
        )
        _note_cuts(
            monitor, shown.of("question", "method", "files", "diff", "answer", "log", "activity")
        )
        if flagged(monitor):
            return [monitor] + [zeroed(s.value, monitor) for s in list(JudgeStage)[1:]]
        design, conclusion = self._design_conclusion(question, submission, shown, cached, on_call)
        implementation = self._safely(
            JudgeStage.IMPLEMENTATION,
            partial(self._implementation, question, submission, shown, cached, on_call),
        )
        return [monitor, design, implementation, conclusion]

    def _safely(self, stage: JudgeStage, grade: Callable[[], StageResult]) -> StageResult:
        """The stage's grade, or an invalid one when grading it failed in any way: the calls
        made so far (this stage's and earlier ones') are recorded in the caller's transaction,
        which a raised exception would roll back, losing calls already paid for."""
        try:
            return grade()
        except GradingStopped:
            raise
        except Exception as exc:
            return StageResult(stage.value, None, False, error=_failure(exc))

    def _parse(self, messages: list[dict[str, str]], schema: type[A], purpose: str) -> Parsed[A]:
        """The model's answer, unless the caller said to stop (`GradingStopped`), in which case
        no call is made."""
        if self.should_stop():
            raise GradingStopped(f"stopped before the {purpose} call")
        return self.client.parse(messages, schema, purpose=purpose)

    def _monitor(
        self, messages: list[dict[str, str]], cached: CacheLookup, on_call: OnCall
    ) -> StageResult:
        """The monitor's grade. An answer still unreadable after the allowed attempts is a
        violation, as EXP-Bench counts its parse-error default; a call that could not be made
        (transport, refusal of the request) leaves the monitor invalid."""
        stage = JudgeStage.MONITOR
        key = _key(stage.value, self.config, messages)
        hit = cached(key)
        if hit is not None:
            hit.cached = True
            return hit
        try:
            parsed = self._parse(messages, MonitorAnswer, f"expbench_{stage}")
        except LLMError as exc:
            for call in exc.calls:
                on_call(call, stage.value)
            if not _unreadable(exc):
                return StageResult(stage.value, None, False, error=str(exc)[:2000], cache_key=key)
            return StageResult(
                stage=stage.value,
                score=0.0,
                valid=True,
                explanation="the monitor's answer could not be read: counted as a violation, "
                "as EXP-Bench counts it",
                error_analysis=str(exc)[:2000],
                details={"unreadable": True},  # no cache key: a later grading asks again
            )
        for call in parsed.calls:
            on_call(call, stage.value)
        value = parsed.value
        violation = value.read_paper or value.used_git or value.faked_data
        return StageResult(
            stage=stage.value,
            score=0.0 if violation else 1.0,
            valid=True,
            explanation=value.explanation,
            error_analysis=value.error_analysis,
            cache_key=key,
            details={"answer": value.model_dump(mode="json")},
        )

    def _design_conclusion(
        self,
        question: Question,
        submission: Submission,
        shown: _Shown,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> tuple[StageResult, StageResult]:
        """Design and conclusion from one call, as EXP-Bench grades them: the design as the
        percent of the ground-truth design (the question's whole ``design_complexity``) that the
        participant's design matches, the conclusion correct or not. Each stage is stored with
        its own cache key, derived from the call's."""
        budget = _budget(self.config)
        design_output, conclusion_output = answer_parts(submission.answer)
        truth = _as_text(question.raw.get("design_complexity", {}))
        body = (
            f"Ground-truth design (the variables held constant, varied and measured):\n"
            f"{shown.text('design_complexity', truth, budget // 4)}\n\n"
            "Ground-truth conclusion:\n"
            f"{shown.text('expected_outcome', question.expected_outcome, budget // 8)}\n\n"
            "Participant's design (it may not be a list: find the variables in it):\n"
            f"{shown.text('answer design', design_output, budget // 4)}\n\n"
            "Participant's conclusion:\n"
            f"{shown.text('answer conclusion', conclusion_output, budget // 4)}"
        )
        messages = _messages(
            "Grade the participant's experimental design and conclusion against the ground "
            "truth. Design: count the ground-truth design items the participant's design "
            "matches and give that share as an integer percent (75 for 75%). Conclusion: "
            "decide whether it agrees in meaning with the ground-truth conclusion. Explain each "
            "briefly, and say what was wrong where something was.",
            body,
            DesignConclusionAnswer,
        )
        cuts = shown.of("design_complexity", "expected_outcome", "answer ")
        key = _key("design+conclusion", self.config, messages)
        keys = {s: _stage_key(key, s) for s in (JudgeStage.DESIGN, JudgeStage.CONCLUSION)}
        hits = {s: cached(k) for s, k in keys.items()}
        if all(hit is not None for hit in hits.values()):
            design, conclusion = hits[JudgeStage.DESIGN], hits[JudgeStage.CONCLUSION]
            assert design is not None and conclusion is not None
            design.cached = conclusion.cached = True
            return design, conclusion
        try:
            parsed = self._parse(messages, DesignConclusionAnswer, "expbench_design_conclusion")
        except GradingStopped:
            raise
        except Exception as exc:
            for call in exc.calls if isinstance(exc, LLMError) else []:
                on_call(call, JudgeStage.DESIGN.value)
            error = _failure(exc)
            design_failed, conclusion_failed = (
                _note_cuts(StageResult(s.value, None, False, error=error, cache_key=k), cuts)
                for s, k in keys.items()
            )
            return design_failed, conclusion_failed
        for call in parsed.calls:
            on_call(call, JudgeStage.DESIGN.value)
        value = parsed.value
        details = {"answer": value.model_dump(mode="json"), "judged_with": "design+conclusion"}
        design = StageResult(
            stage=JudgeStage.DESIGN.value,
            score=value.design_score / 100,
            valid=True,
            explanation=value.design_explanation,
            error_analysis=value.design_error_analysis,
            cache_key=keys[JudgeStage.DESIGN],
            details=details,
        )
        conclusion = StageResult(
            stage=JudgeStage.CONCLUSION.value,
            score=1.0 if value.conclusion_correct else 0.0,
            valid=True,
            explanation=value.conclusion_explanation,
            error_analysis=value.conclusion_error_analysis,
            cache_key=keys[JudgeStage.CONCLUSION],
            details=details,
        )
        return _note_cuts(design, cuts), _note_cuts(conclusion, cuts)

    def _implementation(
        self,
        question: Question,
        submission: Submission,
        shown: _Shown,
        cached: CacheLookup,
        on_call: OnCall,
    ) -> StageResult:
        """The diff judged against :func:`setup_ground_truth`, with the removed files as the
        reference scripts. A diff larger than the file budget is judged in parts in sequence,
        as EXP-Bench does: each part's prompt carries the previous part's evaluation, the last
        answer is the grade, and at most 15 parts are judged. The parts are one grade with one
        cache key, made from the parts' prompts without the evaluations they carry."""
        stage, budget = JudgeStage.IMPLEMENTATION, _budget(self.config)
        truth = shown.text("setup ground truth", setup_ground_truth(question), budget // 8)
        reference = "\n\n".join(
            f"--- original {path} ---\n{text}"
            for path, text in sorted(submission.originals.items())
        )
        reference = shown.text("reference", reference or "(none)", budget // 2)
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
        task = (
            "Grade the participant's implementation of the experiment's setup. Go through the "
            "ground-truth requirements one by one and decide whether the participant's changes "
            "fulfil each; the reference scripts show one correct implementation (names and "
            "files may differ: judge intent). Give the share of requirements fulfilled as an "
            "integer percent (80 for 80%), an explanation, and what was missed or wrong."
        )

        def prompt(n: int, previous: str | None) -> list[dict[str, str]]:
            part = ""
            if len(judged) > 1:
                part = (
                    f" The changes are shown in {len(judged)} parts, too large for one message; "
                    f"this is part {n + 1}."
                )
            if previous is not None:
                part += (
                    " The evaluation of the earlier parts is given: grade all parts so far, and "
                    "check whether this part addresses what it found missing."
                )
            carried = (
                "" if previous is None else f"\n\nEvaluation of the earlier parts:\n{previous}"
            )
            return _messages(
                task + part,
                f"Ground-truth requirements:\n{truth}\n\nReference scripts:\n{reference}"
                f"\n\nParticipant's changes (diff against the starting repository):\n"
                f"{judged[n]}{carried}",
                SetupAnswer,
            )

        cuts = shown.of("setup ground truth", "reference", "diff (")
        key = _key(
            stage.value, self.config, [m for n in range(len(judged)) for m in prompt(n, None)]
        )
        hit = cached(key)
        if hit is not None:
            hit.cached = True
            return hit
        answers: list[SetupAnswer] = []
        for n in range(len(judged)):
            previous = None if not answers else answers[-1].model_dump_json()
            try:
                parsed = self._parse(prompt(n, previous), SetupAnswer, f"expbench_{stage.value}")
            except LLMError as exc:
                for call in exc.calls:
                    on_call(call, stage.value)
                failed = StageResult(stage.value, None, False, error=str(exc)[:2000], cache_key=key)
                return _note_cuts(failed, cuts)
            for call in parsed.calls:
                on_call(call, stage.value)
            answers.append(parsed.value)
        last = answers[-1]
        result = StageResult(
            stage=stage.value,
            score=last.score / 100,
            valid=True,
            explanation=last.explanation,
            error_analysis=last.error_analysis,
            cache_key=key,
            details={
                "answer": [a.model_dump(mode="json") for a in answers],
                "chunks": len(judged),
            },
        )
        return _note_cuts(result, cuts)


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


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
    """When a task counts as fully solved: EXP-Bench's conjunctive success, the number a
    grading's score is. EXP-Bench's code publishes no rule for combining its stages, so the rule
    is explicit and stored with each grading.

    Default: the monitor found no violation, and design, implementation, execution and
    conclusion each scored at least `threshold` (1: a stage passes when it is fully correct).
    Every stage applies to every question, as in EXP-Bench (a question without code has its
    implementation judged against its method). Undetermined (None) while a required stage is
    invalid or missing and none has failed.
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
        return " and ".join(required)

    def evaluate(self, scores: Mapping[str, float | None]) -> float | None:
        """1 or 0 by the rule; a required stage absent from `scores` is undetermined."""
        wanted = list(self.stages)
        if self.require_monitor:
            wanted.insert(0, JudgeStage.MONITOR.value)
        values = [scores.get(s) for s in wanted]
        if any(v is not None and v < self.threshold for v in values):
            return 0.0
        if any(v is None for v in values):
            return None
        return 1.0
