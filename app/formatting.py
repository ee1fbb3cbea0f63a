"""How the portal writes durations: as people read them, not as raw seconds."""

from __future__ import annotations


def duration(seconds: float | int | None) -> str:
    """1313 -> '21 min 53 s'; 7265 -> '2 h 01 min'; 3.2 -> '3.2 s'; None -> '—'."""
    if seconds is None:
        return "—"
    value = float(seconds)
    if value < 60:
        return f"{value:.1f} s" if value < 10 and value != int(value) else f"{value:.0f} s"
    total = round(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s"
