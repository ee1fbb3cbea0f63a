"""Terminal recordings on the attempt's timeline: coordinators read them, nobody else does.

The recording itself, in a real workspace container, is in tests/app/test_terminal_recording.py;
the consent asked before the first login is in tests/app/test_hub_service.py.
"""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.context import Context
from baseline.models import AuditEvent, Role
from baseline.workspaces import terminal_records
from tests.baseline.attempt_world import make_attempt
from tests.conftest import Users, login

SESSION = (
    b"Script started on 2026-12-01 18:31:32+00:00\n"
    b"\x1b]0;participant@ws: /home/submission\x07\x1b[01;32mparticipant@ws\x1b[00m$ "
    b"python train.py --epochs 3\r\nloss 0.25\r\n"
)


def _recorded_attempt(ctx: Context) -> int:
    attempt_id = make_attempt(ctx, human=True)
    with ctx.session() as session:
        terminal_records.store(
            session,
            attempt_id,
            [
                terminal_records.Collected(
                    "/home/logs/terminal/20261201T183132Z-23.typescript",
                    "session",
                    SESSION,
                    len(SESSION) + 100,  # its start was cut: the page says so
                ),
                terminal_records.Collected(
                    terminal_records.HISTORY_FILE, "history", b"#1796149892\nls -la\n", 19
                ),
            ],
        )
    return attempt_id


def test_coordinator_reads_terminal_sessions_and_history(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    attempt_id = _recorded_attempt(ctx)
    login(client, users[Role.COORDINATOR].email)
    detail = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    assert f'href="/attempts/{attempt_id}/terminal"' in detail
    page = client.get(f"/attempts/{attempt_id}/terminal")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    # Escape sequences (colours, window title) are dropped; what was typed and printed stays.
    assert "participant@ws$ python train.py --epochs 3\nloss 0.25" in html
    assert "\x1b" not in html and "\x07" not in html
    assert "Shell history" in html and "ls -la" in html
    assert "(only the last" in html  # the cut session says so
    # Collecting needs a running workspace: said, not a 500.
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert csrf
    refused = client.post(
        f"/attempts/{attempt_id}/terminal/collect", data={"csrf_token": csrf.group(1)}
    )
    assert refused.status_code == 409 and "no running workspace" in refused.get_data(as_text=True)


def test_graders_and_others_never_see_terminal_recordings(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    attempt_id = _recorded_attempt(ctx)
    for role in (Role.GRADER, Role.ANALYST, Role.PARTICIPANT):
        viewer = client.application.test_client()
        login(viewer, users[role].email)
        assert viewer.get(f"/attempts/{attempt_id}/terminal").status_code == 403
        assert viewer.post(f"/attempts/{attempt_id}/terminal/collect").status_code in (400, 403)


def test_a_later_collection_replaces_the_file_it_grew_from(ctx: Context) -> None:
    attempt_id = make_attempt(ctx, human=True)
    path = terminal_records.HISTORY_FILE
    with ctx.session() as session:
        terminal_records.store(
            session, attempt_id, [terminal_records.Collected(path, "history", b"a\n", 2)]
        )
        terminal_records.store(
            session, attempt_id, [terminal_records.Collected(path, "history", b"a\nb\n", 4)]
        )
        rows = terminal_records.recordings(session, attempt_id)
        assert [(r.path, r.content, r.truncated) for r in rows] == [(path, b"a\nb\n", False)]


def test_a_record_that_grows_is_replaced_one_rewritten_is_kept_beside_it(ctx: Context) -> None:
    """Issue 39 item 3: collections only ever add; a rewrite of the same length is caught too."""
    attempt_id = make_attempt(ctx, human=True)
    path = terminal_records.HISTORY_FILE

    def collect(content: bytes, size: int | None = None) -> list[str]:
        item = terminal_records.Collected(path, "history", content, size or len(content))
        with ctx.session() as session:
            terminal_records.store(session, attempt_id, [item])
            return [r.path for r in terminal_records.recordings(session, attempt_id)]

    assert collect(b"ls\n") == [path]
    assert collect(b"ls\npwd\n") == [path]  # grown: one row, replaced
    # Only the last bytes kept (a long file): still recognised as grown where the tails overlap.
    assert collect(b"pwd\nid\n", size=len(b"ls\npwd\nid\n")) == [path]
    paths = collect(b"ls\nrm -rf\n", size=len(b"ls\npwd\nid\n"))  # same length, rewritten
    assert len(paths) == 2 and path in paths
    with ctx.session() as session:
        rows = terminal_records.recordings(session, attempt_id)
        (old,) = terminal_records.tampered(rows)
        assert old.content == b"pwd\nid\n"


def test_an_interrupted_recording_is_shown_beside_the_recordings_and_audited(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """The recorder's gaps file (a recording that ended while its shell ran on), collected with
    the recordings: said at the top of the page and at the session, audited once per gap."""
    attempt_id = _recorded_attempt(ctx)
    session_file = "/var/log/baseline/terminal/20261201T183132Z-41.typescript"
    first = (
        f'{{"at": "2026-12-01T18:40:02Z", "kind": "session", "file": "{session_file}", '
        '"sender_pid": 41, "shell_pid": 35}\n'
    ).encode()
    second = (
        b'{"at": "2026-12-01T18:41:07Z", "kind": "history", '
        b'"file": "/var/log/baseline/shell_history", "sender_pid": 48, "shell_pid": 47}\n'
    )

    def collect(gaps: bytes) -> None:
        with ctx.session() as session:
            terminal_records.store(session, attempt_id, [
                terminal_records.Collected(session_file, "session", SESSION, len(SESSION)),
                terminal_records.Collected(terminal_records.GAPS_FILE, "gaps", gaps, len(gaps)),
            ])  # fmt: skip
            session.commit()

    collect(first)
    collect(first + second)  # a later collection: only the new gap is audited
    login(client, users[Role.COORDINATOR].email)
    html = client.get(f"/attempts/{attempt_id}/terminal").get_data(as_text=True)
    banner = re.search(r'<div class="flash error" id="interrupted">.*?</div>', html, re.S)
    assert banner and "2 recording(s) stopped while the shell still ran" in banner.group(0)
    assert (
        "Recording interrupted while the shell still ran (at 2026-12-01T18:40:02Z, session "
        f"<code>{session_file}</code>" in banner.group(0)
    )
    assert "(at 2026-12-01T18:41:07Z, history <code>/var/log/baseline/shell_history</code>" in html
    # Beside the session it interrupted too; the gaps file is no recording of its own.
    section = re.search(rf"<code>{session_file}</code></h2>.*?</section>", html, re.S)
    assert section and "interrupted while the shell still ran (at 2026-12-01T18:40:02Z)" in (
        section.group(0)
    )
    assert f"<code>{terminal_records.GAPS_FILE}</code></h2>" not in html
    with ctx.session() as session:
        events = session.scalars(
            select(AuditEvent)
            .where(AuditEvent.action == "terminal.interrupted")
            .order_by(AuditEvent.id)
        ).all()
        assert [(e.details["at"], e.details["file"]) for e in events] == [
            ("2026-12-01T18:40:02Z", session_file),
            ("2026-12-01T18:41:07Z", "/var/log/baseline/shell_history"),
        ]
