"""The judge's HTTP path (scoring.chat_http): the SDK's error types, kept-alive connections that
the server closed, and proxies from the environment."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest

from scoring.chat_http import ChatTransport
from tests.fake_openai import FakeOpenAI

BODY = {"model": "fake-judge", "messages": [{"role": "user", "content": "hello"}]}


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    return {"echo": body["messages"][-1]["content"]}


def test_answers_and_failures_are_the_sdks() -> None:
    with FakeOpenAI(answer=_answer, fault_plan=["429", "500"]) as server:
        transport = ChatTransport(server.base_url, "sk-test", 5.0)
        with pytest.raises(openai.RateLimitError) as limited:
            transport.post(BODY)
        assert limited.value.response.headers["retry-after-ms"] == "0"
        with pytest.raises(openai.InternalServerError):
            transport.post(BODY)
        answer = transport.post(BODY)
        transport.close()
    content = json.loads(answer.body)["choices"][0]["message"]["content"]
    assert json.loads(content) == {"echo": "hello"}
    assert answer.headers["content-type"] == "application/json"
    assert server.authorizations == ["Bearer sk-test"] * 3


def test_a_refused_connection_is_an_api_connection_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = ChatTransport(f"http://127.0.0.1:{port}/v1", "k", 2.0)
    with pytest.raises(openai.APIConnectionError):
        transport.post(BODY)


@pytest.fixture
def one_answer_per_connection() -> Iterator[tuple[str, list[int]]]:
    """A server that answers one request per connection and then closes it without saying
    so (no ``Connection: close``), as a provider does with a connection idle too long."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(1)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += conn.recv(65536)
                body = json.dumps({"choices": []}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", connections
    finally:
        listener.close()


def test_a_kept_alive_connection_the_server_closed_is_replaced_not_failed(
    one_answer_per_connection: tuple[str, list[int]],
) -> None:
    url, connections = one_answer_per_connection
    transport = ChatTransport(url, "k", 5.0)
    for _ in range(3):
        assert json.loads(transport.post(BODY).body) == {"choices": []}
    assert len(connections) == 3


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, str]]


class _ProxyHandler(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: absolute-form requests, relayed as they are."""

    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Proxy-Authorization") or ""))
        target = urllib.parse.urlsplit(self.path)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        upstream.request("POST", target.path, body=body, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    server = _Proxy(("127.0.0.1", 0), _ProxyHandler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_environments_proxy_carries_the_calls_unless_no_proxy_exempts_them(
    proxy: _Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("http_proxy", f"http://judge:s%40cret@127.0.0.1:{proxy.server_port}")
    with FakeOpenAI(answer=_answer) as server:
        ChatTransport(server.base_url, "k", 5.0).post(BODY)
        assert proxy.seen == [(server.base_url + "/chat/completions", "Basic anVkZ2U6c0BjcmV0")]
        assert server.calls == 1
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        ChatTransport(server.base_url, "k", 5.0).post(BODY)
        assert len(proxy.seen) == 1 and server.calls == 2
