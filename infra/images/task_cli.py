#!/usr/bin/env python3
"""task: the attempt's own commands, inside the workspace (installed as /usr/local/bin/task).

    task status            working time used and left, next checkpoint, pauses
    task pause [NOTE]      pause the working clock (human participants)
    task resume            resume it after your own pause
    task score             an intermediate score of /home/submission (scored tasks)
    task submit [--yes]    submit: final snapshot, the attempt ends (asks for confirmation)
    task note TEXT         leave a note in the attempt's record

It authenticates with this attempt's token (~/.baseline/task.json, placed by Baseline when the
workspace was created; it opens this attempt only and is revoked when the attempt ends) and reaches
the portal through Baseline's relay on this container's loopback, which works without internet
access. Standard library only: it runs on the image's system Python.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CONFIG = Path(os.environ.get("BASELINE_TASK_CONFIG", "/home/participant/.baseline/task.json"))
TIMEOUT_S = 900.0  # an intermediate score runs the task's scoring: minutes, not seconds
USAGE = __doc__.split("\n\n")[1] if __doc__ else ""


class Refused(Exception):
    pass


def _config() -> dict[str, Any]:
    try:
        value = json.loads(CONFIG.read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"no attempt credentials at {CONFIG} ({exc})") from exc
    if not isinstance(value, dict) or not {"attempt_id", "token", "url"} <= set(value):
        raise Refused(f"{CONFIG} is not a task credentials file")
    return value


def call(method: str, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    config = _config()
    url = f"{config['url']}/api/v1/attempts/{config['attempt_id']}/workspace/{op}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {config['token']}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
            return answer
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message") or exc.reason
        except ValueError:
            message = exc.reason
        raise Refused(f"refused ({exc.code}): {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise Refused(
            f"cannot reach the portal through the relay at {config['url']}: {exc}"
        ) from exc


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def status() -> str:
    s = call("GET", "task")
    lines = [
        f"attempt {s['attempt_id']}: {s['status']}"
        + (f" (paused: {s['pause_reason']})" if s["paused"] else ""),
        f"working time used {_hours(s['working_s'])}, left {_hours(s['remaining_s'])} "
        f"of {_hours(s['limit_s'])}",
        f"next checkpoint at {_hours(s['next_checkpoint_working_s'])} of working time",
    ]
    pauses = s["pauses"]
    lines.append(f"pauses: {len(pauses)}")
    for pause in pauses:
        until = pause["ended_at"] or "now"
        lines.append(f"  {pause['reason']}: {pause['started_at']} - {until} {pause['note']}")
    return "\n".join(lines)


def submit(args: list[str]) -> str:
    if "--yes" not in args:
        if not sys.stdin.isatty():
            raise Refused("submitting is final: run `task submit --yes` to confirm")
        answer = input("Submit now? Your attempt ends and /home/submission is final. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return "not submitted"
    done = call("POST", "submit", {})
    return f"{done['message']} ({done['file_count']} files)"


def score() -> str:
    done = call("POST", "score", {})
    if done["error"]:
        return f"scoring failed: {done['error']}"
    return f"score {done['score']:.3f} (raw {done['raw_score']:g})"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, args = argv[0], argv[1:]
    try:
        if command == "status":
            out = status()
        elif command == "pause":
            out = call("POST", "pause", {"note": " ".join(args)})["message"]
        elif command == "resume":
            out = call("POST", "resume", {})["message"]
        elif command == "score":
            out = score()
        elif command == "submit":
            out = submit(args)
        elif command == "note":
            if not args:
                raise Refused("usage: task note TEXT")
            out = call("POST", "note", {"text": " ".join(args)})["message"]
        else:
            raise Refused(f"unknown command {command!r}\n{USAGE}")
    except Refused as exc:
        print(f"task: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
