"""The model relay that runs inside a workspace (standard library only: the workspace's python3).

It listens on the workspace's own loopback, so a command agent reaches its model passthrough
with no network at all (a study without internet included). Two processes, both root's:

- ``serve``: the HTTP server, detached from any exec. Each request becomes a file
  ``<dir>/in/<id>.json`` (body in base64), and the connection waits until the worker answers by
  copying ``<id>.json`` and then ``<id>.done`` into ``<dir>/out``.
- ``stream``: the worker's reader, run by the exec whose output stream the worker reads
  (`baseline.runs.command_agents`): a ready line naming its process, then one line a request
  (``MARK`` + JSON), every request waiting for an answer when it starts included, except those
  already answered whose connection has not collected the answer yet (asked again, the model
  would be called twice).

The server outlives its worker: a worker that restarts starts a new reader, which hands it the
requests that were in flight, so the agent's waiting connection gets its answer instead of being
cut. Only root can read ``in`` or write ``out``. Both channels are the workspace backend's own
(exec and copy-in), so it works the same on local and ssh:// Docker hosts, and nothing is opened
from the workspace to anywhere.

Usage: python3 workspace_relay.py serve DIR PORT | stream DIR PORT
"""

import base64
import json
import os
import socket
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MARK = "@@baseline-model@@ "
ANSWER_WAIT_S = 3600.0
POLL_S = 0.02
PASSED_HEADERS = ("authorization", "api-key", "content-type", "accept")


class Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle's algorithm on a kept-alive connection
    # the body waits for the client's delayed ACK (40 ms on Linux) on every model call.
    disable_nagle_algorithm = True
    directory = ""

    def log_message(self, format: str, *args: object) -> None:
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
        request = os.path.join(self.directory, "in", rid + ".json")
        with open(request + ".tmp", "w") as handle:
            json.dump(frame, handle)
        os.rename(request + ".tmp", request)  # a reader sees it whole or not at all
        done = os.path.join(self.directory, "out", rid + ".done")
        answer_path = os.path.join(self.directory, "out", rid + ".json")
        deadline = time.monotonic() + ANSWER_WAIT_S
        try:
            while not os.path.exists(done):
                if time.monotonic() > deadline:
                    self._send(504, "application/json", b'{"error": {"message": "no answer"}}')
                    return
                time.sleep(POLL_S)
            with open(answer_path, "rb") as handle:
                answer = json.load(handle)
            for path in (answer_path, done):
                os.remove(path)
        finally:
            os.remove(request)
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


def serve(directory: str, port: int) -> None:
    """The HTTP server, until it is killed (the attempt's end stops the workspace)."""
    Relay.directory = directory
    server = Server(("127.0.0.1", port), Relay)
    server.serve_forever()


def stream(directory: str, port: int) -> None:
    """Print each waiting request once, oldest first, after a ready line once the server
    answers; the requests waiting at the start are those a dead reader left unanswered."""
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.stdout.write(f"relay: nothing listens on port {port}\n")
        sys.exit(1)
    sys.stdout.write(MARK + json.dumps({"ready": port, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    incoming = os.path.join(directory, "in")
    sent: set[str] = set()
    while True:
        names = {n for n in os.listdir(incoming) if n.endswith(".json")}
        waiting = [os.path.join(incoming, n) for n in names - sent]
        for path in sorted(waiting, key=_age):
            rid = os.path.basename(path)[: -len(".json")]
            if os.path.exists(os.path.join(directory, "out", rid + ".done")):
                continue  # answered: its connection collects the answer and removes it
            try:
                with open(path) as handle:
                    line = json.dumps(json.load(handle))
            except (OSError, ValueError):  # answered and removed meanwhile
                continue
            sys.stdout.write(MARK + line + "\n")
            sys.stdout.flush()
        sent = (sent & names) | {os.path.basename(p) for p in waiting}
        time.sleep(POLL_S)


def _age(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def main() -> None:
    mode, directory, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "serve":
        serve(directory, port)
    elif mode == "stream":
        stream(directory, port)
    else:
        sys.exit(f"relay: unknown mode {mode!r}")


if __name__ == "__main__":
    main()
