"""The portal's template filters: numbers shown as people write them."""

from __future__ import annotations

from flask import Flask


def test_numbers_are_shown_as_people_write_them_and_never_as_minus_zero(app: Flask) -> None:
    """A score an older Baseline stored as -0.0 (a lower-is-better task's exact start) showed
    as "-0"; it is 0, as the start is by construction."""
    num = app.jinja_env.filters["num"]
    assert [num(v) for v in (-0.0, 0, 2.0, 0.25, -0.5, None)] == ["0", "0", "2", "0.25", "-0.5", ""]
