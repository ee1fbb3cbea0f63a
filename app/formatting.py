"""How the portal writes durations, sizes and codes: as people read them, not as raw seconds,
bytes or identifiers."""

from __future__ import annotations


def duration(seconds: float | int | None) -> str:
    """1313 -> '21 min 53 s'; 7265 -> '2 h 01 min'; 900 -> '15 min'; 3600 -> '1 h';
    3.2 -> '3.2 s'; None -> '—'."""
    if seconds is None:
        return "—"
    value = float(seconds)
    if value < 59.5:  # what rounds to a minute reads as one
        return f"{value:.1f} s" if value < 10 and value != int(value) else f"{value:.0f} s"
    total = round(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"


def byte_size(size: int) -> str:
    """567 -> '567 B'; 12177 -> '11.9 KB'; 3 << 30 -> '3.0 GB' (units of 1024)."""
    value = float(size)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def words(code: object) -> str:
    """A stored code as words: 'rate_limit' -> 'rate limit', PauseReason.NO_DRIVER -> 'no driver'.
    The exports and the API keep the codes; a page's reader should not have to decode them."""
    return str(code).replace("_", " ")
