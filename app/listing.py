"""Filters, sorting and paging of a list page, read from the query string with clear errors.

Long lists (a study's attempts, the audit log) are shown a page at a time; every link keeps the
other query arguments, so sorting or paging never drops a filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from flask import request, url_for

from baseline.errors import InvalidInput

PAGE_SIZE = 25
MAX_PAGE = 10**6


@dataclass(frozen=True)
class Page:
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size

    @property
    def first_row(self) -> int:
        return min(self.offset + 1, self.total)

    @property
    def last_row(self) -> int:
        return min(self.offset + self.size, self.total)


def int_arg(name: str) -> int | None:
    """An optional positive integer argument (a database id, a page number)."""
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"{name}: expected a positive whole number, got {raw[:40]!r}")
    return int(raw)


def choice_arg(name: str, allowed: list[str] | tuple[str, ...], default: str = "") -> str:
    raw = request.args.get(name, "").strip()
    if not raw:
        return default
    if raw not in allowed:
        raise InvalidInput(f"{name}: expected one of {', '.join(allowed)}; got {raw[:40]!r}")
    return raw


def page_of(total: int, size: int = PAGE_SIZE) -> Page:
    number = int_arg("page") or 1
    if number > MAX_PAGE:
        raise InvalidInput(f"page: at most {MAX_PAGE}")
    return Page(min(number, max(1, math.ceil(total / size))), size, total)


def link(**changes: Any) -> str:
    """This page's URL with some query arguments changed (None removes one)."""
    args: dict[str, Any] = {k: v for k, v in request.args.items() if v != ""}
    for key, value in changes.items():
        if value is None:
            args.pop(key, None)
        else:
            args[key] = value
    assert request.endpoint is not None
    return url_for(request.endpoint, **(request.view_args or {}), **args)
