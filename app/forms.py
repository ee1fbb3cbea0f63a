"""Small helpers for reading HTML form fields into typed values with clear errors."""

from __future__ import annotations

import math

from flask import request

from baseline.errors import InvalidInput


def text_field(name: str, *, required: bool = True, max_length: int = 10000) -> str:
    value = request.form.get(name, "").strip()
    if required and not value:
        raise InvalidInput(f"{name.replace('_', ' ')}: required")
    if len(value) > max_length:
        raise InvalidInput(f"{name.replace('_', ' ')}: at most {max_length} characters")
    return value


def float_field(name: str, default: float | None = None) -> float | None:
    raw = request.form.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise InvalidInput(f"{name.replace('_', ' ')}: not a number: {raw!r}") from exc
    if not math.isfinite(value):
        raise InvalidInput(f"{name.replace('_', ' ')}: must be finite")
    return value


def float_list_field(name: str, default: list[float]) -> list[float]:
    raw = request.form.get(name, "").strip()
    if not raw:
        return default
    try:
        return [float(part) for part in raw.replace(";", ",").split(",") if part.strip()]
    except ValueError as exc:
        raise InvalidInput(
            f"{name.replace('_', ' ')}: expected numbers separated by commas"
        ) from exc
