"""The portal's shared reading of the hub's health (`infra.hub.health`): every participant's work
page polls it, so the hub is asked once per reading, not once per poll, and a hub that hangs
holds one caller, not all of them."""

from __future__ import annotations

import threading

from infra.hub.health import SharedHubHealth


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_reading_is_shared_until_it_is_older_than_its_age() -> None:
    asked: list[bool] = []
    answers = iter([True, False])
    clock = _Clock()

    def probe() -> bool:
        asked.append(True)
        return next(answers)

    health = SharedHubHealth(probe, max_age_s=2.0, clock=clock)
    assert all(health.is_up() for _ in range(20))
    assert len(asked) == 1
    clock.now += 1.9
    assert health.is_up() and len(asked) == 1
    clock.now += 0.2  # 2.1 s old: asked again, and the new answer is what callers see
    assert not health.is_up() and not health.is_up()
    assert len(asked) == 2


def test_callers_answer_from_the_last_reading_while_one_asks_a_hanging_hub() -> None:
    clock = _Clock()
    hanging, release = threading.Event(), threading.Event()
    calls = 0

    def probe() -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:  # the second reading: the hub accepts the connection and says nothing
            hanging.set()
            release.wait(10)
            return False
        return True

    health = SharedHubHealth(probe, max_age_s=2.0, clock=clock)
    assert health.is_up()
    clock.now += 5
    stuck = threading.Thread(target=health.is_up)
    stuck.start()
    assert hanging.wait(10)
    # While that caller waits on the hub, the others answer at once from the last reading.
    others = [health.is_up() for _ in range(5)]
    assert others == [True] * 5 and calls == 2
    release.set()
    stuck.join(10)
    assert not health.is_up() and calls == 2  # the hanging hub's answer, now the reading


def test_the_first_callers_wait_for_the_one_reading_there_is() -> None:
    """Before any reading there is nothing to answer from: concurrent first callers wait for
    one question to the hub rather than each asking it."""
    started, release = threading.Event(), threading.Event()
    calls = 0

    def probe() -> bool:
        nonlocal calls
        calls += 1
        started.set()
        release.wait(10)
        return True

    health = SharedHubHealth(probe)
    answers: list[bool] = []
    callers = [threading.Thread(target=lambda: answers.append(health.is_up())) for _ in range(8)]
    for caller in callers:
        caller.start()
    assert started.wait(10)
    release.set()
    for caller in callers:
        caller.join(10)
    assert answers == [True] * 8 and calls == 1
