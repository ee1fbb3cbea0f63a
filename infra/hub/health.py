"""One reading of the hub's health shared by every request of a portal process.

Each participant's work page asks the portal every few seconds whether JupyterHub answers (to
say "Reconnecting to JupyterLab" while it does not). Asking the hub once per poll would send it a
request per participant per poll, and while the hub is down each of those polls would hold one of
the portal's request threads for the whole connection timeout. So a reading is shared for
`max_age_s`, only one request asks the hub at a time, and the others answer from the last
reading meanwhile: with the hub down, one thread waits for the timeout and the rest answer at
once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class SharedHubHealth:
    """Whether the hub answered, asked at most once per `max_age_s` by one caller at a time."""

    def __init__(
        self,
        probe: Callable[[], bool],
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._max_age_s = max_age_s
        self._clock = clock
        self._state = threading.Lock()  # guards the reading
        self._asking = threading.Lock()  # held by the one caller asking the hub
        self._up: bool | None = None
        self._read_at = 0.0

    def is_up(self) -> bool:
        """The hub's health no older than `max_age_s`, or the last reading while another caller
        asks the hub (the first caller of all waits for that answer: there is no reading yet)."""
        with self._state:
            if self._up is not None and self._clock() - self._read_at < self._max_age_s:
                return self._up
            last = self._up
        if last is not None and not self._asking.acquire(blocking=False):
            return last
        if last is None:
            self._asking.acquire()
        try:
            with self._state:  # another caller may have read it while this one waited
                if self._up is not None and self._clock() - self._read_at < self._max_age_s:
                    return self._up
            up = self._probe()
            with self._state:
                self._up, self._read_at = up, self._clock()
            return up
        finally:
            self._asking.release()
