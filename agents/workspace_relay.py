"""The model relay that runs inside a workspace (standard library only: the workspace's python3).

It listens on the workspace's own loopback, so a command agent reaches its model passthrough
with no network at all (a study without internet included). Each HTTP request becomes one line
on standard output (``MARK`` + JSON, body in base64), which the worker reads from the exec stream
that started this relay (`baseline.runs.command_agents`); the worker answers by copying
``<id>.json`` and then ``<id>.done`` into ``<dir>/out``, which only root can write. Both channels
are the workspace backend's own (exec and copy-in), so it works the same on local and ssh://
Docker hosts, and nothing is opened from the workspace to anywhere.

Usage: python3 workspace_relay.py DIR PORT
"""

import base64
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARK = "@@baseline-model@@ "
ANSWER_WAIT_S = 3600.0
POLL_S = 0.02
PASSED_HEADERS = ("authorization", "api-key", "content-type", "accept")

_out_lock = threading.Lock()


class Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle's algorithm on a kept-alive connection
    # the body waits for the client's delayed ACK (40 ms on Linux) on every model call.
    disable_nagle_algorithm = True
    out_dir = ""

    def log_message(self, format: str, *args: object) -> None:  # stdout is the channel
        return

    def _relay(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rid = uuid.uuid4().hex
        frame = {
            "id": rid,
            "method": self.command,
            "path": self.path,
            "headers": {k: self.headers[k] for k in PASSED_HEADERS if self.headers.get(k)},
            "body": base64.b64encode(body).decode(),
        }
        with _out_lock:
            sys.stdout.write(MARK + json.dumps(frame) + "\n")
            sys.stdout.flush()
        done = os.path.join(self.out_dir, rid + ".done")
        answer_path = os.path.join(self.out_dir, rid + ".json")
        deadline = time.monotonic() + ANSWER_WAIT_S
        while not os.path.exists(done):
            if time.monotonic() > deadline:
                self._send(504, "application/json", b'{"error": {"message": "no answer"}}')
                return
            time.sleep(POLL_S)
        with open(answer_path, "rb") as handle:
            answer = json.load(handle)
        for path in (answer_path, done):
            os.remove(path)
        self._send(answer["status"], answer["content_type"], base64.b64decode(answer["body"]))

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _relay
    do_POST = _relay


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    directory, port = sys.argv[1], int(sys.argv[2])
    Relay.out_dir = os.path.join(directory, "out")
    for _ in range(100):  # an earlier relay, just killed, may still hold the port
        try:
            server = Server(("127.0.0.1", port), Relay)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.stdout.write(f"relay: port {port} is taken\n")
        sys.exit(1)
    sys.stdout.write(MARK + json.dumps({"ready": port}) + "\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
