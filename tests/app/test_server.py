"""The portal's server: a taken port is said at once, before anything else starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from app import server
from baseline.context import Context
from infra.listen_ports import PortInUse
from tests.ports import free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.fixture
def scheduler_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each start of the background scheduler, recorded instead of made."""
    started: list[str] = []
    monkeypatch.setattr(
        "baseline.jobs.scheduler.lead_scheduler", lambda _ctx: started.append("scheduler")
    )
    return started


def test_check_port_names_the_taken_port(taken_port: int) -> None:
    with pytest.raises(PortInUse, match=f"port {taken_port} on 127.0.0.1 is in use"):
        server.check_port("127.0.0.1", taken_port)
    server.check_port("127.0.0.1", free_port())  # free: nothing raised


def test_the_server_checks_its_port_before_the_scheduler_starts(
    ctx: Context, taken_port: int, scheduler_starts: list[str]
) -> None:
    """A taken port stops run_server before it starts what it would then have to stop."""
    with pytest.raises(PortInUse):
        server.run_server(ctx, host="127.0.0.1", port=taken_port, with_scheduler=True)
    assert scheduler_starts == []


def test_a_port_taken_after_the_check_stops_what_started(
    ctx: Context, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken between the check and the bind: the error is the same, and the scheduler that
    started meanwhile is ended."""
    events: list[str] = []

    class Scheduler:
        def end(self) -> None:
            events.append("ended")

    monkeypatch.setattr(server, "check_port", lambda host, port: None)  # the race: it looked free

    def lead(_ctx: Context) -> Scheduler:
        events.append("led")
        return Scheduler()

    monkeypatch.setattr("baseline.jobs.scheduler.lead_scheduler", lead)
    with pytest.raises(PortInUse, match=f"port {taken_port} on 127.0.0.1 is in use"):
        server.run_server(ctx, host="127.0.0.1", port=taken_port, with_scheduler=True)
    assert events == ["led", "ended"]


def test_a_taken_hub_port_stops_the_portal_before_anything_starts(
    ctx: Context, taken_port: int, scheduler_starts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASELINE_HUB_PORT", str(taken_port))
    with pytest.raises(PortInUse, match=f"JupyterHub's port {taken_port} on 127.0.0.1 is in use"):
        server.run_server(
            ctx, host="127.0.0.1", port=free_port(), with_scheduler=True, with_hub=True
        )
    assert scheduler_starts == []
