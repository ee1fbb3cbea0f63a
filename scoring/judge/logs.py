"""Reduce a reproduce.log to what a judge needs, within a token budget.

Training logs are mostly progress bars: carriage-return redraws and thousands of lines that differ
only in their numbers. Keeping the last redraw of each line, folding runs of lines that differ only
in digits, then keeping the head and (more of) the tail, leaves the errors and final metrics.
"""

from __future__ import annotations

import re

from scoring.llm import Tokenizer

_DIGITS = re.compile(r"\d+")


def _fold(lines: list[str]) -> list[str]:
    out: list[str] = []
    run_shape: str | None = None
    run: list[str] = []

    def flush() -> None:
        if not run:
            return
        out.append(run[0])
        if len(run) > 2:
            out.append(f"[... {len(run) - 2} similar lines ...]")
        if len(run) > 1:
            out.append(run[-1])

    for line in lines:
        shape = _DIGITS.sub("#", line)
        if shape == run_shape:
            run.append(line)
            continue
        flush()
        run_shape, run = shape, [line]
    flush()
    return out


def reduce_log(text: str, tokenizer: Tokenizer, max_tokens: int) -> str:
    """The log with progress redraws and repetitive runs folded, cut to `max_tokens` tokens."""
    lines = [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in text.split("\n")]
    reduced = "\n".join(_fold(lines))
    if tokenizer.fits(reduced, max_tokens):
        return reduced
    head = tokenizer.head(reduced, max_tokens // 3)
    tail = tokenizer.tail(reduced, max_tokens - max_tokens // 3 - 20)
    return f"{head}\n[... log cut to fit: middle omitted ...]\n{tail}"
