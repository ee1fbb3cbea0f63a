"""Reduce a reproduce.log to what a judge needs, as PaperBench's SimpleJudge does.

Training logs are mostly progress bars and thousands of lines that differ only in their numbers.
PaperBench (``paperbench.judge.utils.reduce_log``) masks what changes from line to line
(timestamps, dates, times, progress bars, IP addresses, long hex strings), groups lines into
templates with drain3, and keeps the first line of each run of lines of one template followed by
"(repeated N times)". The reduced log is then cut to a token budget (PaperBench: the first half of
the context); ``tail_share`` of the budget may be kept from the end instead (PaperBench: 0), where
errors and final metrics are.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig

from scoring.llm import Tokenizer

_MASKS = (
    (re.compile(r"\d{4}-\d{2}-\d{2}T[0-9:.]+Z"), "<TIMESTAMP>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "<DATE>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}\b"), "<TIME>"),
)
_PROGRESS = re.compile(r"\d+%?\|[█=]+|[KMG]?B/s|\d+%\s*\||[▏▎▍▌▋▊▉]{2,}")
_LATE_MASKS = (
    (re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b"), "<IP>"),
    (re.compile(r"\b[0-9a-fA-F]{8,}\b"), "<HEX>"),
)
CUT_MARK = "[... log cut to fit ...]"


def _masked(line: str) -> str:
    """The line with what changes between repetitions masked (PaperBench's `sanitize_line`)."""
    for pattern, mask in _MASKS:
        line = pattern.sub(mask, line)
    if _PROGRESS.search(line):
        line = "<PROGRESS_BAR>"
    for pattern, mask in _LATE_MASKS:
        line = pattern.sub(mask, line)
    return line


class _Collapser:
    """PaperBench's reduction, line by line: each run of lines of one drain3 template is kept as
    its first line and "(repeated N times)"."""

    def __init__(self) -> None:
        # drain3 logs every new template at INFO; its default configuration is PaperBench's.
        logging.getLogger("drain3").setLevel(logging.WARNING)
        self._miner = TemplateMiner(config=TemplateMinerConfig())
        self.lines: list[str] = []
        self.chars = 0
        self._previous: int | None = None
        self._repeats = 1

    def add(self, line: str) -> None:
        cluster = self._miner.add_log_message(_masked(line))["cluster_id"]
        if cluster == self._previous:
            self._repeats += 1
            return
        self._close_run()
        self.lines.append(line)
        self.chars += len(line) + 1
        self._previous, self._repeats = cluster, 1

    def _close_run(self) -> None:
        if self._repeats > 1:
            self.lines.append(f"  (repeated {self._repeats} times)")
            self._repeats = 1

    def text(self) -> str:
        self._close_run()
        return "\n".join(self.lines)


@dataclass(frozen=True)
class ReducedLog:
    text: str
    cut: bool  # the reduced log did not fit the budget


# The reduction costs about 80 us a line (drain3): a log is reduced only until its reduced head
# is over the budget, checked each time this many more characters were kept.
_CHECK_EVERY_CHARS = 20_000


def reduce_log(
    text: str, tokenizer: Tokenizer, max_tokens: int, tail_share: float = 0.0
) -> ReducedLog:
    """The log with repeats collapsed, cut to `max_tokens` tokens: its head, and `tail_share` of
    the budget from its end.

    The head is exactly the head of PaperBench's reduction of the whole log: lines are reduced
    one by one and already kept lines never change, so reduction stops once what it kept is over
    the budget. The tail is the reduction of the log's last lines on their own.
    """
    tail_tokens = int(max_tokens * tail_share)
    head_tokens = max_tokens - tail_tokens - 20
    lines = text.splitlines()
    collapser = _Collapser()
    checked = 0
    over = False
    for line in lines:
        collapser.add(line)
        if collapser.chars - checked > _CHECK_EVERY_CHARS:
            checked = collapser.chars
            if not tokenizer.fits("\n".join(collapser.lines), max_tokens):
                over = True
                break
    if not over:
        reduced = collapser.text()
        if tokenizer.fits(reduced, max_tokens):
            return ReducedLog(reduced, cut=False)
    head = tokenizer.head("\n".join(collapser.lines), head_tokens)
    if tail_tokens == 0:
        return ReducedLog(f"{head}\n{CUT_MARK}", cut=True)
    end = _Collapser()
    taken: list[str] = []
    size = 0
    for line in reversed(lines):  # enough raw lines for the tail, whatever they reduce to
        taken.append(line)
        size += len(line) + 1
        if size > 16 * tail_tokens:
            break
    for line in reversed(taken):
        end.add(line)
    tail = tokenizer.tail(end.text(), tail_tokens)
    return ReducedLog(f"{head}\n{CUT_MARK}\n{tail}", cut=True)
