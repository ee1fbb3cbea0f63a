"""The monitor tests' receivers: a local SMTP server (aiosmtpd) and a webhook endpoint."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.ports import free_port


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:
        self.messages.append(envelope.content)
        return "250 OK"


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Mailbox]:
    box = Mailbox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("BASELINE_SMTP_URL", f"smtp://127.0.0.1:{port}")
    monkeypatch.setenv("BASELINE_ALERT_FROM", "monitor@test.example")
    yield box
    controller.stop()


class Hook:
    """A webhook receiver that answers 503 to its first `fail_first` requests."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.requests: list[tuple[dict[str, str], bytes]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests.append((dict(self.headers.items()), body))
                self.send_response(503 if len(hook.requests) <= hook.fail_first else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook() -> Iterator[Hook]:
    """A receiver that refuses the first two requests (503): the sender must retry."""
    receiver = Hook(fail_first=2)
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture
def steady_hook() -> Iterator[Hook]:
    receiver = Hook(fail_first=0)
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()
