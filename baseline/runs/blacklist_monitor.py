"""The blacklist monitor: an audit of every attempt, human or agent, against its task's
blacklist.txt (PaperBench's format: one URL a line).

Blocking stays with the egress proxy; the monitor finds what blocking cannot prove: a request the
proxy logged (allowed or refused, it still shows intent), a blacklisted URL in an agent's
transcript (what it was told or wrote), and one in the workspace's shell history. Matching is the
proxy's own rule (`infra.egress.rules`): same host (``www.`` ignored), path under the entry's path,
and for a GitHub repository the hosts that serve its files too (codeload, raw, the API). Each hit
is stored once, with its evidence (the URL or line), where it was found and when, for a
coordinator to review; a study may also disqualify on the first hit. It runs after every step
of an agent and on every new egress event of any attempt (`egress_job`, the scheduler's).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts import attempts
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.errors import DomainError, NotFound
from baseline.models import (
    Attempt,
    BlacklistHit,
    EgressEvent,
    Host,
    TranscriptEntry,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.runs.transcripts import run_of
from baseline.tasks.tasks import read_task_file
from baseline.workspaces import egress_gateway, terminal_records, workspaces
from infra.egress.rules import BlacklistRule, parse_blacklist
from infra.workspace import PARTICIPANT_USER, WorkspaceError

log = logging.getLogger(__name__)

HISTORY_FILES = (
    "/home/participant/.bash_history",
    terminal_records.FALLBACK_HISTORY_FILE,
    terminal_records.HISTORY_FILE,  # the root recorder's (issue 39 item 3)
)
# A URL, a bare host/path (github.com/owner/repo) or an scp-style git remote (git@host:path).
_CANDIDATE = re.compile(
    r"(?:[a-z][a-z0-9+.-]*://|git@)?(?:[a-z0-9-]+\.)+[a-z]{2,}(?::[0-9]+)?(?:[/:][^\s'\"<>`)\]]*)?",
    re.IGNORECASE,
)
HistoryReader = Callable[[Session, Attempt], Iterable[tuple[str, int, str]]]


@dataclass(frozen=True)
class Finding:
    source: str
    rule: str
    evidence: str
    location: str
    at: datetime | None

    @property
    def key(self) -> str:
        text = "\x00".join((self.source, self.location, self.evidence))
        return hashlib.sha256(text.encode()).hexdigest()


def rules_for(session: Session, ctx: Context, attempt: Attempt) -> list[BlacklistRule]:
    if not any(f.path == "blacklist.txt" for f in attempt.task.files):
        return []
    text = read_task_file(store_for(ctx), attempt.task, "blacklist.txt")
    return parse_blacklist(text.decode("utf-8", errors="replace"))


def match_url(rules: list[BlacklistRule], url: str) -> BlacklistRule | None:
    text = url.strip().rstrip(".,;:")
    if text.lower().startswith("git@"):
        text = "https://" + text[4:].replace(":", "/", 1)
    if "://" not in text:
        text = "https://" + text
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
    except ValueError:
        return None
    return next((r for r in rules if r.matches(host, parts.path)), None)


def match_text(rules: list[BlacklistRule], text: str) -> list[tuple[BlacklistRule, str]]:
    """Every blacklisted URL mentioned in a text, with the rule it breaks."""
    found = []
    for candidate in _CANDIDATE.findall(text):
        rule = match_url(rules, candidate)
        if rule is not None:
            found.append((rule, candidate))
    return found


def _workspace_rows(session: Session, attempt: Attempt) -> list[Workspace]:
    return list(
        session.scalars(
            select(Workspace).where(
                Workspace.attempt_id == attempt.id, Workspace.purpose == WorkspacePurpose.ATTEMPT
            )
        )
    )


def _egress(session: Session, attempt: Attempt, rules: list[BlacklistRule]) -> list[Finding]:
    rows = _workspace_rows(session, attempt)
    if not rows:
        return []
    events = session.scalars(
        select(EgressEvent)
        .where(
            or_(
                EgressEvent.workspace_id.in_([w.id for w in rows]),
                EgressEvent.workspace_name.in_([w.name for w in rows]),
            )
        )
        .order_by(EgressEvent.at, EgressEvent.id)
    )
    findings = []
    for event in events:
        rule = match_url(rules, event.url)
        if rule is not None:
            verdict = "allowed" if event.allowed else "refused by the proxy"
            findings.append(
                Finding(
                    "egress",
                    rule.source,
                    f"{event.method} {event.url} ({verdict})",
                    f"egress event {event.id}",
                    event.at,
                )
            )
    return findings


def _transcript(session: Session, attempt: Attempt, rules: list[BlacklistRule]) -> list[Finding]:
    run = run_of(session, attempt.id)
    if run is None:
        return []
    findings = []
    entries = session.scalars(
        select(TranscriptEntry)
        .where(TranscriptEntry.run_id == run.id)
        .order_by(TranscriptEntry.seq)
    )
    for entry in entries:
        texts = [entry.content or ""]
        texts += [str(c.get("function", {}).get("arguments", "")) for c in entry.tool_calls or []]
        for text in texts:
            for line in text.splitlines():
                for rule, _url in match_text(rules, line):
                    findings.append(
                        Finding(
                            "transcript",
                            rule.source,
                            line.strip()[:2000],
                            f"transcript step {entry.seq} ({entry.role or entry.kind})",
                            entry.started_at,
                        )
                    )
                    break
    return findings


def workspace_history(
    backend_factory: workspaces.BackendFactory,
) -> HistoryReader:
    """Reads the shell history files of the attempt's live workspace through its backend; with
    none running (an agent's, stopped at its end), the history files collected when it stopped
    (`terminal_records`), which went with its container."""

    def read(session: Session, attempt: Attempt) -> Iterable[tuple[str, int, str]]:
        running = [
            w
            for w in _workspace_rows(session, attempt)
            if w.status is WorkspaceStatus.RUNNING and w.host_id is not None
        ]
        if not running:
            for recording in terminal_records.recordings(session, attempt.id):
                if recording.path in HISTORY_FILES:
                    text = recording.content.decode("utf-8", errors="replace")
                    for number, line in enumerate(text.splitlines(), 1):
                        yield recording.path, number, line
        for workspace in running:
            host = session.get(Host, workspace.host_id)
            if host is None:
                continue
            backend = backend_factory(host)
            try:
                for path in HISTORY_FILES:
                    result = backend.exec(
                        workspaces.handle_of(workspace), ["cat", "--", path],
                        timeout_s=30, user=PARTICIPANT_USER,
                    )  # fmt: skip
                    if result.exit_code != 0:
                        continue  # no such file
                    text = result.output.decode("utf-8", errors="replace")
                    for number, line in enumerate(text.splitlines(), 1):
                        yield path, number, line
            except WorkspaceError:
                continue
            finally:
                close = getattr(backend, "close", None)
                if callable(close):
                    close()

    return read


def _history(
    session: Session, attempt: Attempt, rules: list[BlacklistRule], reader: HistoryReader
) -> list[Finding]:
    findings = []
    for path, number, line in reader(session, attempt):
        hits = match_text(rules, line)
        if hits:
            findings.append(
                Finding(
                    "shell_history",
                    hits[0][0].source,
                    line.strip()[:2000],
                    f"{path} line {number}",
                    None,
                )
            )
    return findings


def scan(
    ctx: Context,
    attempt_id: int,
    *,
    history_reader: HistoryReader | None = None,
    disqualify: bool = False,
    history: bool = True,
) -> list[BlacklistHit]:
    """Check one attempt; store and return the hits not found before (idempotent). Without
    `history` only what the database holds (egress log, transcript): what `watch` checks."""
    reader = history_reader or workspace_history(workspaces.backend_for_host)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        rules = rules_for(session, ctx, attempt)
        if not rules:
            return []
        findings = (
            _egress(session, attempt, rules)
            + _transcript(session, attempt, rules)
            + (_history(session, attempt, rules, reader) if history else [])
        )
        known = set(
            session.scalars(
                select(BlacklistHit.evidence_key).where(BlacklistHit.attempt_id == attempt_id)
            )
        )
        new = []
        for finding in findings:
            if finding.key in known:
                continue
            known.add(finding.key)
            hit = BlacklistHit(
                attempt_id=attempt_id, source=finding.source, rule=finding.rule,
                evidence=finding.evidence, location=finding.location, at=finding.at,
                evidence_key=finding.key,
            )  # fmt: skip
            session.add(hit)
            new.append(hit)
        session.flush()
        for hit in new:
            audit.record(session, "attempt.blacklist_hit", "attempt", attempt_id, None,
                         source=hit.source, evidence=hit.evidence[:300])  # fmt: skip
            session.expunge(hit)
        live = attempt.status.value not in ("disqualified",)
    if new and disqualify and live:
        attempts.disqualify(ctx, attempt_id, None, f"blacklisted resource used: {new[0].evidence}")
    return new


def watch(ctx: Context, attempt_id: int) -> list[BlacklistHit]:
    """The monitor as the drivers run it, after every step of an agent (its transcript, and the
    egress events its tools made): the database's evidence only, no exec into the workspace, so
    that hits show up as they happen instead of when a coordinator runs `attempt monitor`. A
    monitor that cannot read its blacklist (a stored file missing) logs it and leaves the run be:
    `attempt monitor` reports it to whoever looks."""
    try:
        return scan(ctx, attempt_id, history=False)
    except DomainError as exc:
        log.warning("blacklist monitor of attempt %s: %s", attempt_id, exc)
        return []


def egress_job(ctx: Context) -> list[BlacklistHit]:
    """The scheduler's egress job: the gateways' events recorded (`egress_gateway.ingest_job`),
    then the monitor on every attempt whose workspace made new requests, a human's as an agent's.
    Run only after an agent's steps, it missed people's requests until a coordinator scanned by
    hand. Returns the new hits."""
    reports = egress_gateway.ingest_job(ctx) or {}
    names = set().union(*(report.workspaces for report in reports.values()))
    if not names:
        return []
    with ctx.session() as session:
        found = session.scalars(
            select(Workspace.attempt_id).where(
                Workspace.name.in_(names), Workspace.purpose == WorkspacePurpose.ATTEMPT
            )
        )
        attempt_ids = sorted({attempt_id for attempt_id in found if attempt_id is not None})
    return [hit for attempt_id in attempt_ids for hit in watch(ctx, attempt_id)]


def study_hits(session: Session, study_id: int) -> list[BlacklistHit]:
    """Every hit of a study's attempts, oldest first: what its page lists for review."""
    return list(
        session.scalars(
            select(BlacklistHit)
            .join(Attempt, BlacklistHit.attempt_id == Attempt.id)
            .where(Attempt.study_id == study_id)
            .order_by(BlacklistHit.id)
        )
    )


def hits_of(session: Session, attempt_id: int) -> list[BlacklistHit]:
    return list(
        session.scalars(
            select(BlacklistHit)
            .where(BlacklistHit.attempt_id == attempt_id)
            .order_by(BlacklistHit.id)
        )
    )
