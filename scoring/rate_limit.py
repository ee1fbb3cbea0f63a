"""Client-side pacing of model calls against a provider's requests- and tokens-per-minute limits.

Why pace at all: a judge grading thousands of leaves with 100 calls in flight sends far faster
than a provider allows, and every 429 costs a round trip plus a back-off during which nothing is
sent; bursts then alternate with silence and the run takes longer than the limit itself requires.
Pacing to the limit keeps throughput at the allowed rate without triggering the throttle.

Two token buckets, one for requests and one for tokens. Each refills continuously at its
per-minute rate and holds at most `burst_s` seconds' worth, so a full bucket never releases a
minute's worth at once (providers enforce their limits over sub-minute windows as well), and
paces to `headroom` (92%) of the limit so that a burst after a quiet spell stays under it too.
A call reserves its estimated tokens (prompt plus the expected completion) before it is sent;
when it returns, `settle` charges or refunds the difference from its real usage.

Adapting to the server: a 429 (`penalize`) stops everyone until the server's `retry-after` has
passed, and `observe` reads OpenAI-style `x-ratelimit-remaining-*` / `x-ratelimit-reset-*`
headers, so a provider whose limit is lower than configured (shared key, another process) is
followed too.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# How many seconds of the per-minute rate a full bucket holds.
DEFAULT_BURST_S = 0.5
# The share of a limit that is used: a provider that enforces its limit over a window of W
# seconds sees at most (burst_s + W + J) * headroom / 60 of a minute's allowance in any window,
# where J is how much the time the provider counts a call at varies from call to call (its
# answer time, a busy client's or server's scheduling): calls paced over W + J seconds can land
# in one window. With 0.92 that stays under the limit for every W of 10 s and more and J up to
# a third of a second; 0.95 allowed no J at all, and a busy machine saw a few 429s.
DEFAULT_HEADROOM = 0.92

# A wait shorter than this is rounding error of the refill arithmetic, not a limit.
_NEGLIGIBLE_S = 1e-6

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_reset(value: str) -> float | None:
    """Seconds from an OpenAI reset header such as ``1s``, ``6m0s``, ``250ms`` or ``0.5``."""
    text = value.strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    unit_s = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, consumed = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        total += float(match.group(1)) * unit_s[match.group(2)]
        consumed += len(match.group(0))
    return total if consumed == len(text) else None


@dataclass
class _Bucket:
    per_minute: float
    burst_s: float
    level: float = 0.0
    stamp: float = 0.0

    @property
    def capacity(self) -> float:
        return self.per_minute * self.burst_s / 60.0

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_minute / 60.0)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` may be taken; a request larger than the bucket waits for a
        full bucket and then drives the level negative (the debt is paid by later waits)."""
        needed = min(amount, self.capacity)
        if self.level >= needed:
            return 0.0
        return (needed - self.level) * 60.0 / self.per_minute


@dataclass
class RateLimiter:
    """Thread-safe pacing for one endpoint; `None` for a limit means no limit of that kind."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst_s: float = DEFAULT_BURST_S
    headroom: float = DEFAULT_HEADROOM
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _blocked_until: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        now = self.clock()
        self._requests = (
            _Bucket(self.requests_per_minute * self.headroom, self.burst_s, stamp=now)
            if self.requests_per_minute
            else None
        )
        self._tokens = (
            _Bucket(self.tokens_per_minute * self.headroom, self.burst_s, stamp=now)
            if self.tokens_per_minute
            else None
        )
        # Start with full buckets: the first calls of a run go out at once.
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.level = bucket.capacity

    @property
    def active(self) -> bool:
        return self._requests is not None or self._tokens is not None

    def acquire(self, tokens: int) -> float:
        """Block until one request of `tokens` tokens may be sent; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self.clock()
                delay = max(0.0, self._blocked_until - now)
                for bucket, amount in ((self._requests, 1.0), (self._tokens, float(tokens))):
                    if bucket is not None:
                        bucket.refill(now)
                        delay = max(delay, bucket.wait_for(amount))
                if delay <= _NEGLIGIBLE_S:  # float rounding must not spin forever
                    if self._requests is not None:
                        self._requests.level -= 1.0
                    if self._tokens is not None:
                        self._tokens.level -= float(tokens)
                    return waited
            self.sleep(delay)
            waited += delay

    def settle(self, reserved: int, used: int) -> None:
        """Correct a reservation by the call's real token usage (refund or extra charge)."""
        if self._tokens is None or used <= 0:
            return
        with self._lock:
            self._tokens.refill(self.clock())
            self._tokens.level = min(self._tokens.capacity, self._tokens.level + reserved - used)

    def penalize(self, retry_after_s: float | None) -> None:
        """The server said 429: send nothing until its retry-after (or one bucket-time) passed."""
        pause = retry_after_s if retry_after_s and retry_after_s > 0 else self.burst_s / 2
        with self._lock:
            self._blocked_until = max(self._blocked_until, self.clock() + pause)

    def observe(self, headers: Mapping[str, str]) -> None:
        """Follow the server's own accounting: nothing left of a limit means wait for its reset."""
        lowered = {key.lower(): value for key, value in headers.items()}
        waits: list[float] = []
        for kind in ("requests", "tokens"):
            remaining = lowered.get(f"x-ratelimit-remaining-{kind}")
            reset = lowered.get(f"x-ratelimit-reset-{kind}")
            if remaining is None or reset is None:
                continue
            try:
                left = float(remaining)
            except ValueError:
                continue
            seconds = parse_reset(reset)
            if left <= 0 and seconds:
                waits.append(seconds)
        if waits:
            with self._lock:
                self._blocked_until = max(self._blocked_until, self.clock() + max(waits))


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The wait a 429 asks for: ``retry-after-ms``, else ``retry-after`` in seconds."""
    lowered = {key.lower(): value for key, value in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = lowered.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue
    return None
