"""Pacing of model calls: token buckets on a virtual clock, 429 pauses and rate-limit headers."""

from __future__ import annotations

import itertools

import pytest

from scoring.rate_limit import RateLimiter, parse_reset, retry_after_seconds


class VirtualTime:
    """A clock that only moves when someone sleeps: pacing is tested without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def limiter(**kwargs: float) -> tuple[RateLimiter, VirtualTime]:
    time = VirtualTime()
    return RateLimiter(clock=time.clock, sleep=time.sleep, headroom=1.0, **kwargs), time


def test_requests_per_minute_paces_after_a_small_burst() -> None:
    rate, time = limiter(requests_per_minute=60, burst_s=2)
    sent_at = []
    for _ in range(12):
        rate.acquire(0)
        sent_at.append(time.now)
    assert sent_at[:2] == [0.0, 0.0]  # a full bucket holds two seconds' worth
    gaps = [b - a for a, b in itertools.pairwise(sent_at[2:])]
    assert all(gap == pytest.approx(1.0) for gap in gaps)  # then one a second: 60 a minute
    assert sent_at[-1] == pytest.approx(10.0)


def test_tokens_per_minute_paces_by_size() -> None:
    rate, time = limiter(tokens_per_minute=6_000, burst_s=2)  # 100 tokens a second, 200 held
    for _ in range(2):
        rate.acquire(100)
    assert time.now == 0.0
    rate.acquire(100)
    assert time.now == pytest.approx(1.0)
    rate.acquire(300)  # larger than the bucket: waits for a full bucket, then owes the rest
    assert time.now == pytest.approx(3.0)
    rate.acquire(100)  # the debt of 100 plus this call's 100: two more seconds
    assert time.now == pytest.approx(5.0)


def test_over_a_long_run_the_rate_is_the_limit() -> None:
    rate, time = limiter(requests_per_minute=600, tokens_per_minute=60_000, burst_s=2)
    for _ in range(1_000):
        rate.acquire(50)  # tokens allow 1,200 a minute: requests (600) bind
    minutes = time.now / 60
    assert 1_000 / minutes == pytest.approx(600, rel=0.03)


def test_settle_refunds_an_overestimate_and_charges_an_underestimate() -> None:
    rate, time = limiter(tokens_per_minute=6_000, burst_s=2)
    rate.acquire(200)
    rate.settle(reserved=200, used=50)  # 150 tokens back
    rate.acquire(150)
    assert time.now == 0.0
    rate.settle(reserved=150, used=350)  # 200 more than reserved: two seconds of debt
    rate.acquire(1)
    assert time.now == pytest.approx(2.01, abs=0.02)


def test_a_429_stops_every_caller_until_its_retry_after() -> None:
    rate, time = limiter(requests_per_minute=6_000)
    rate.acquire(0)
    rate.penalize(3.0)
    rate.acquire(0)
    assert time.now == pytest.approx(3.0)


def test_exhausted_server_headers_hold_calls_until_the_reset() -> None:
    rate, time = limiter(requests_per_minute=6_000)
    rate.observe({"x-ratelimit-remaining-tokens": "5000", "x-ratelimit-reset-tokens": "20s"})
    rate.acquire(0)
    assert time.now == 0.0  # something left: no wait
    rate.observe({"X-RateLimit-Remaining-Tokens": "0", "X-RateLimit-Reset-Tokens": "1m30s"})
    rate.acquire(0)
    assert time.now == pytest.approx(90.0)


def test_no_limits_means_no_waiting() -> None:
    rate, time = limiter()
    assert not rate.active
    for _ in range(100):
        rate.acquire(10_000)
    assert time.now == 0.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("250ms", 0.25), ("0.5", 0.5), ("1h2m3s", 3723.0), ("x", None)],
)
def test_reset_header_formats(text: str, seconds: float | None) -> None:
    assert parse_reset(text) == (None if seconds is None else pytest.approx(seconds))


def test_retry_after_headers() -> None:
    assert retry_after_seconds({"retry-after-ms": "1500"}) == pytest.approx(1.5)
    assert retry_after_seconds({"Retry-After": "2"}) == pytest.approx(2.0)
    assert retry_after_seconds({}) is None


def test_headroom_keeps_a_burst_after_silence_under_a_ten_second_window() -> None:
    time = VirtualTime()
    rate = RateLimiter(tokens_per_minute=6_000, clock=time.clock, sleep=time.sleep)
    time.now = 100.0  # a quiet spell: the bucket is full
    sent: list[tuple[float, int]] = []
    while time.now < 130:
        rate.acquire(10)
        sent.append((time.now, 10))
    for start in range(100, 120):
        in_window = sum(t for when, t in sent if start <= when < start + 10)
        assert in_window <= 6_000 * 10 / 60  # never over the provider's 10 s share
