"""Latency of the study monitor at 500 attempts and 20 hosts, against the study page in one run.

Seeds a SQLite study (migrated to head) with `--attempts` started attempts (default 500) over 50
participants and 10 tasks, each with two pauses, four snapshots, a reproduction and a grading
per snapshot, three ledger rows and a running workspace on one of `--hosts` hosts (default 20,
8 GPUs each); some of the queue still queued. The human attempts were opened in JupyterHub (an
account and a used hub login each), and the home holds a reading of the hub's activity of their
servers, as the evaluation job keeps it (`baseline.monitor.hub_activity`). Then, through the
portal (Flask's test client, a logged-in coordinator; the API with a bearer token), measures:

- the monitor page (`/studies/<id>/monitor`, the board embedded),
- an update as the page's poll makes it: the board with the ETag it holds (304, nothing changed),
- an update after a change (a pause opened and closed: 200, the whole board),
- one alert evaluation of the study (what the scheduler's job does every 30 s),
- the baseline: the study page (`/studies/<id>`), which lists the same attempts.

Prints p50/p99 in milliseconds per case and each case's p99 over the baseline's.

    .venv/bin/python benchmarks/bench_monitor.py [--attempts 500] [--hosts 20] [--repeat 40]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from baseline import migrate
from baseline.config import Settings
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    GpuAssignment,
    Grading,
    GradingKind,
    Host,
    HubLoginToken,
    JobStatus,
    ModelCall,
    Participant,
    ParticipantKind,
    Pause,
    PauseReason,
    Reproduction,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    StudyStatus,
    StudyTask,
    Task,
    TaskKind,
    User,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.monitor import alerts
from baseline.people import accounts

PASSWORD = "bench-password-long"


def seed(ctx: Context, n_attempts: int, n_hosts: int) -> int:
    now = utcnow()
    with ctx.session() as session:
        study = Study(name="bench", status=StudyStatus.ACTIVE, checkpoint_hours=[2, 8, 32, 48])
        session.add(study)
        hosts = [
            Host(
                name=f"gpu-{h:02d}",
                docker_url=f"ssh://baseline@gpu-{h:02d}",
                healthy=h != 7,
                last_checked_at=now,
                last_error=None if h != 7 else "ssh: connect timed out",
                gpus=[{"index": i, "model": "H100"} for i in range(8)],
            )
            for h in range(n_hosts)
        ]
        tasks = [
            Task(slug=f"task-{t}", title=f"Task {t}", kind=TaskKind.PAPER, content_hash="0" * 64)
            for t in range(10)
        ]
        session.add_all([*hosts, *tasks])
        session.flush()
        session.add_all([StudyTask(study_id=study.id, task_id=t.id) for t in tasks])
        people = [
            Participant(
                study_id=study.id,
                kind=ParticipantKind.HUMAN if p % 2 else ParticipantKind.AGENT,
                display_name=f"Participant {p}",
                pseudonym=f"P{p:03d}",
                agent_scaffold=None if p % 2 else "basic",
                agent_model=None if p % 2 else "model-x",
            )
            for p in range(50)
        ]
        session.add_all(people)
        session.flush()
        for person in people:
            if person.kind is ParticipantKind.HUMAN:
                account = User(email=f"{person.pseudonym}@bench.example", name=person.pseudonym,
                               password_hash="-", role=Role.PARTICIPANT)  # fmt: skip
                session.add(account)
                session.flush()
                person.user_id = account.id
        servers: dict[str, str] = {}
        for i in range(n_attempts):
            started = now - timedelta(hours=6, minutes=i % 60)
            attempt = Attempt(
                study_id=study.id,
                participant_id=people[i % 50].id,
                task_id=tasks[i % 10].id,
                status=AttemptStatus.RUNNING,
                hardware_profile="h100",
                working_time_limit_s=48 * 3600.0,
                started_at=started,
                first_login_at=started,
            )
            session.add(attempt)
            session.flush()
            user_id = people[i % 50].user_id
            if user_id is not None:
                session.add(HubLoginToken(token_hash=f"{attempt.id:064x}", user_id=user_id,
                                          attempt_id=attempt.id, expires_at=started,
                                          used_at=started))  # fmt: skip
                servers[f"u{user_id}/a{attempt.id}"] = (now - timedelta(minutes=i % 90)).isoformat()
            session.add_all(
                [
                    Pause(
                        attempt_id=attempt.id,
                        started_at=started + timedelta(minutes=30 * k + 10),
                        ended_at=started + timedelta(minutes=30 * k + 20),
                        reason=PauseReason.PARTICIPANT if k else PauseReason.IDLE,
                        note="",
                    )
                    for k in range(2)
                ]
            )
            snaps = [
                Snapshot(
                    attempt_id=attempt.id,
                    kind=SnapshotKind.START if k == 0 else SnapshotKind.INTERVAL,
                    due_working_s=k * 3600.0,
                    taken_working_s=k * 3600.0,
                    taken_at=started + timedelta(hours=k),
                    manifest_sha256="0" * 64,
                )
                for k in range(4)
            ]
            session.add_all(snaps)
            ws = Workspace(
                attempt_id=attempt.id,
                purpose=WorkspacePurpose.ATTEMPT,
                host_id=hosts[i % n_hosts].id,
                backend="docker",
                name=f"ws-{attempt.id}",
                image="img",
                hardware_profile="h100",
                status=WorkspaceStatus.RUNNING,
            )
            session.add(ws)
            session.flush()
            if i < n_hosts * 8:
                session.add(
                    GpuAssignment(
                        host_id=hosts[i % n_hosts].id, device_index=i // n_hosts, workspace_id=ws.id
                    )
                )
            for k, snap in enumerate(snaps):
                queued = k == 3 and i % 5 == 0
                status = JobStatus.QUEUED if queued else JobStatus.SUCCEEDED
                session.add(Reproduction(snapshot_id=snap.id, status=status, finished_at=now))
                session.add(
                    Grading(
                        snapshot_id=snap.id,
                        kind=GradingKind.JUDGE,
                        status=status,
                        score=None if queued else 0.1 * k,
                        finished_at=None if queued else now,
                    )
                )
            session.add_all(
                [
                    ModelCall(
                        study_id=study.id,
                        attempt_id=attempt.id,
                        purpose="agent" if k else "judge_grade",
                        model="m",
                        cost_usd=0.01 * (k + 1),
                        created_at=started + timedelta(minutes=k),
                    )
                    for k in range(3)
                ]
            )
        accounts.create_user(
            session, "coord@bench.example", "Coordinator", PASSWORD, Role.COORDINATOR
        )
    reading = ctx.settings.home / "monitor" / "hub-activity.json"
    reading.parent.mkdir(parents=True, exist_ok=True)
    reading.write_text(json.dumps({"tried_at": now.isoformat(), "servers": servers}))
    return study.id


@dataclass
class Held:
    """What the polling page holds: the board's ETag, and how many polls got a whole board."""

    tag: str
    full: int = 0


def timed(call: Callable[[], int], expect: int, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each call (CPU: this process's, which runs the portal and
    SQLite; on a machine shared with other work it is what the update costs, wall what it
    took)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        status = call()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        if status != expect:
            raise SystemExit(f"expected HTTP {expect}, got {status}")
    return wall, cpu


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=500)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()

    from app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'bench.db'}"
        migrate.upgrade(url)
        ctx = Context.from_settings(Settings(home=home, database_url=url, secret_key="bench"))
        t0 = time.perf_counter()
        study_id = seed(ctx, args.attempts, args.hosts)
        print(
            f"seeded {args.attempts} attempts, {args.hosts} hosts "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        app = create_app(context=ctx)
        app.config.update(WTF_CSRF_ENABLED=False)
        client = app.test_client()
        page = client.get("/login").get_data(as_text=True)
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        client.post(
            "/login",
            data={
                "email": "coord@bench.example",
                "password": PASSWORD,
                "csrf_token": token.group(1) if token else "",
            },
        )
        board_url = f"/studies/{study_id}/monitor/board"
        first = client.get(board_url)
        assert first.status_code == 200, first.status_code
        held = Held(first.headers["ETag"])
        assert len(first.get_json()["attempts"]) == args.attempts

        def poll() -> int:
            """As the page polls: with the ETag it holds, taking the new one on a 200 (the
            version's time bucket turns every 30 s)."""
            answer = client.get(board_url, headers={"If-None-Match": held.tag})
            if answer.status_code == 200:
                held.tag, held.full = answer.headers["ETag"], held.full + 1
                return 304
            return answer.status_code

        def changed() -> int:
            with ctx.session() as session:  # a pause opened and closed: the board changes
                attempt = session.get(Attempt, 1)
                assert attempt is not None
                at = utcnow()
                session.add(
                    Pause(
                        attempt_id=1, started_at=at, ended_at=at, reason=PauseReason.ADMIN, note=""
                    )
                )
            answer = client.get(board_url, headers={"If-None-Match": held.tag})
            held.tag = answer.headers["ETag"]
            return answer.status_code

        def evaluate() -> int:
            alerts.evaluate_and_deliver(ctx, study_id)
            return 200

        load = os.getloadavg()[0]
        cases = {
            "study page (baseline)": timed(
                lambda: client.get(f"/studies/{study_id}").status_code, 200, args.repeat
            ),
            "monitor page": timed(
                lambda: client.get(f"/studies/{study_id}/monitor").status_code, 200, args.repeat
            ),
            "update, unchanged (304)": timed(poll, 304, args.repeat),
            "update, changed (200)": timed(changed, 200, args.repeat),
            "alert evaluation": timed(evaluate, 200, args.repeat),
        }
        base = p(cases["study page (baseline)"][0], 0.99)
        print(f"unchanged polls answered 200 at a time-bucket turn: {held.full} of {args.repeat}")
        print(f"load average before the cases: {load:.1f} on {os.cpu_count()} CPUs")
        print(
            f"{'case':26} {'p50 ms':>7} {'p99 ms':>7} {'p99/base':>9} {'cpu p50':>8} {'cpu p99':>8}"
        )
        for name, (wall, cpu) in cases.items():
            print(
                f"{name:26} {statistics.median(wall):7.1f} {p(wall, 0.99):7.1f} "
                f"{p(wall, 0.99) / base:9.2f} {statistics.median(cpu):8.1f} {p(cpu, 0.99):8.1f}"
            )
        ctx.engine.dispose()


if __name__ == "__main__":
    main()
