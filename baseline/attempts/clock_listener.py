"""Who is told, in this process, that an attempt's clock changed (a pause, a resume, an extension).

The snapshot scheduler (`baseline.jobs.scheduler`) listens while it runs here, so that the
attempt's next due time moves at once; the attempts context tells it through this slot instead of
importing the scheduler, which sits above it (the scheduler takes snapshots through `attempts`).
A change made in another process (the CLI) is picked up by the scheduler's periodic sweep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

ClockListener = Callable[[int], None]

_lock = threading.Lock()
_listener: ClockListener | None = None


def listen(listener: ClockListener) -> None:
    """Tell `listener` of every change from now on (the scheduler that started last)."""
    global _listener
    with _lock:
        _listener = listener


def stop_listening(listener: ClockListener) -> None:
    """Stop telling `listener`, if it is still the one told."""
    global _listener
    with _lock:
        if _listener == listener:
            _listener = None


def clock_changed(attempt_id: int) -> None:
    """The attempt's clock changed: its due times are to be recomputed now."""
    with _lock:
        listener = _listener
    if listener is not None:
        listener(attempt_id)
