"""The plain HTTP target the network tests reach from inside workspaces: every GET answers
200 "ok", quietly; a subclass that sets `seen` also records the paths asked for."""

from __future__ import annotations

import http.server


class OkHandler(http.server.BaseHTTPRequestHandler):
    seen: list[str] | None = None

    def do_GET(self) -> None:
        if self.seen is not None:
            self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        return
