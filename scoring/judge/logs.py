"""Reduce a reproduce.log to what a judge needs, as PaperBench's SimpleJudge does.

Training logs are mostly progress bars and thousands of lines that differ only in their numbers.
PaperBench (``paperbench.judge.utils.reduce_log``) masks what changes from line to line
(timestamps, dates, times, progress bars, IP addresses, long hex strings), groups lines into
templates with drain3, and keeps the first line of each run of lines of one template followed by
"(repeated N times)". The reduced log is then cut to a token budget (PaperBench: the first half of
the context); ``tail_share`` of the budget may be kept from the end instead (PaperBench: 0), where
errors and final metrics are.

The log is read as a stream of lines (from a :class:`LogFile` a piece at a time), and reduction
stops once its head is over the budget: a 50 MB log is neither read whole nor held in memory. A
line longer than `MAX_LINE_CHARS` is cut there (PaperBench keeps it whole; a line that long is far
over any log budget, and holding it would make memory grow with the log).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig

from scoring.judge.submission import LogFile
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
MAX_LINE_CHARS = 1_000_000
_TEXT_CHUNK_CHARS = 1_000_000  # an in-memory log is split into lines this much at a time
# What str.splitlines ends a line at; "\r\n" is one line end.
_LINE_ENDS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


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


def _without_end(piece: str) -> tuple[str, bool]:
    """A piece of ``str.splitlines(keepends=True)``: its text, and whether it ended a line."""
    if piece.endswith("\r\n"):
        return piece[:-2], True
    if piece[-1] in _LINE_ENDS:
        return piece[:-1], True
    return piece, False


def _lines(chunks: Iterable[str], max_line_chars: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of the chunks joined, as ``str.splitlines`` gives them, each cut at
    `max_line_chars` characters: only one (cut) line is held at a time."""
    parts: list[str] = []
    size = 0
    after_cr = False  # the previous chunk ended with "\r": a "\n" starting this one joins it
    for chunk in chunks:
        if not chunk:
            continue
        if after_cr and chunk.startswith("\n"):
            chunk = chunk[1:]
        after_cr = chunk.endswith("\r")
        for piece in chunk.splitlines(keepends=True):
            text, ended = _without_end(piece)
            if size < max_line_chars:
                parts.append(text[: max_line_chars - size])
                size += len(parts[-1])
            if ended:
                yield "".join(parts)
                parts, size = [], 0
    if parts:
        yield "".join(parts)


def _chunks(log: str | LogFile) -> Generator[str, None, None]:
    if isinstance(log, LogFile):
        yield from log.chunks()
        return
    for start in range(0, len(log), _TEXT_CHUNK_CHARS):
        yield log[start : start + _TEXT_CHUNK_CHARS]


def _last_lines(log: str | LogFile, max_chars: int) -> list[str]:
    """The log's last lines, about `max_chars` characters (bytes of a file) of them: a line
    only partly inside is left out, unless it is the only one."""
    if isinstance(log, LogFile):
        text, whole = log.tail(max_chars)
    else:
        text, whole = log[-max_chars:], len(log) <= max_chars
    lines = list(_lines([text]))
    return lines if whole or len(lines) < 2 else lines[1:]


@dataclass(frozen=True)
class ReducedLog:
    text: str
    cut: bool  # the reduced log did not fit the budget


# The reduction costs about 80 us a line (drain3): a log is reduced only until its reduced head
# is over the budget, checked each time this many more characters were kept.
_CHECK_EVERY_CHARS = 20_000


def reduce_log(
    log: str | LogFile, tokenizer: Tokenizer, max_tokens: int, tail_share: float = 0.0
) -> ReducedLog:
    """The log with repeats collapsed, cut to `max_tokens` tokens: its head, and `tail_share` of
    the budget from its end.

    The head is exactly the head of PaperBench's reduction of the whole log: lines are reduced
    one by one and already kept lines never change, so reduction (and reading) stops once what it
    kept is over the budget. The tail is the reduction of the log's last lines on their own.
    """
    tail_tokens = int(max_tokens * tail_share)
    head_tokens = max_tokens - tail_tokens - 20
    collapser = _Collapser()
    checked = 0
    over = False
    chunks = _chunks(log)
    try:
        for line in _lines(chunks):
            collapser.add(line)
            if collapser.chars - checked > _CHECK_EVERY_CHARS:
                checked = collapser.chars
                if not tokenizer.fits("\n".join(collapser.lines), max_tokens):
                    over = True
                    break
    finally:
        chunks.close()  # a log file stops being read here
    if not over:
        reduced = collapser.text()
        if tokenizer.fits(reduced, max_tokens):
            return ReducedLog(reduced, cut=False)
    head = tokenizer.head("\n".join(collapser.lines), head_tokens)
    if tail_tokens == 0:
        return ReducedLog(f"{head}\n{CUT_MARK}", cut=True)
    end = _Collapser()
    for line in _last_lines(log, 16 * tail_tokens):  # enough for the tail, whatever it reduces to
        end.add(line)
    tail = tokenizer.tail(end.text(), tail_tokens)
    return ReducedLog(f"{head}\n{CUT_MARK}\n{tail}", cut=True)
