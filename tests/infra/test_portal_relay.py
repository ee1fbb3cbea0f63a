"""The portal relay's bookkeeping, without a Docker Engine."""

from __future__ import annotations

import asyncio
import logging

import pytest

from infra.portal_relay import PortalRelay


def test_a_workspace_the_relay_cannot_enter_is_reported_once_not_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = PortalRelay(
        lambda: {"ws-1": ("unix:///nowhere.sock", "c1")},
        portal_port=8000,
        inside_port=8749,
        docker_cmd="/nonexistent/docker",
    )

    async def rounds() -> None:
        for _ in range(3):
            await relay.sync()

    with caplog.at_level(logging.WARNING, logger="infra.portal_relay"):
        asyncio.run(rounds())
    warnings = [r for r in caplog.records if "cannot open a channel into ws-1" in r.message]
    assert len(warnings) == 1
    assert relay.channels == {}
