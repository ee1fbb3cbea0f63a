"""Delivering an alert's firing or clearing: by e-mail (SMTP) and to a signed webhook.

The SMTP server is the deployment's, read from the environment: ``BASELINE_SMTP_URL``
(``smtp://host:port``; unset, no e-mail is sent) and ``BASELINE_ALERT_FROM`` (the sender). The
recipients and the webhook are the study's (`baseline.monitor.settings`).

A webhook request is a JSON POST signed with HMAC-SHA256 over ``"<timestamp>.<body>"`` with the
study's secret: headers ``X-Baseline-Timestamp`` and ``X-Baseline-Signature: sha256=<hex>``, so
a receiver can check who sent it and refuse a replay. A refused or failed request is retried with
doubling back-off (a 4xx other than 408/429 is final: retrying cannot mend it). Every delivery,
kept or failed, is recorded as an `AlertDelivery` row with its tries and error.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from baseline.models import Alert, AlertDelivery, Study
from baseline.monitor import settings

WEBHOOK_TRIES = 4
WEBHOOK_BACKOFF_S = 0.5
TIMEOUT_S = 10.0
SIGNATURE_HEADER = "X-Baseline-Signature"
TIMESTAMP_HEADER = "X-Baseline-Timestamp"


@dataclass(frozen=True)
class Outcome:
    tries: int
    ok: bool
    error: str | None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value for one request (what a receiver recomputes)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def _final(status: int) -> bool:
    return 400 <= status < 500 and status not in (408, 429)


def post_webhook(
    url: str,
    secret: str,
    payload: dict[str, Any],
    *,
    tries: int = WEBHOOK_TRIES,
    backoff_s: float = WEBHOOK_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """POST the payload, signed; retried with doubling back-off until a 2xx or the last try."""
    body = json.dumps(payload, sort_keys=True).encode()
    error: str | None = None
    for attempt in range(1, tries + 1):
        timestamp = str(int(time.time()))
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: sign(secret, timestamp, body),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                answer.read()
            return Outcome(attempt, True, None)
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
            if _final(exc.code):
                return Outcome(attempt, False, error)
        except (urllib.error.URLError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        if attempt < tries:
            sleep(backoff_s * 2 ** (attempt - 1))
    return Outcome(tries, False, error)


def smtp_server() -> tuple[str, int] | None:
    """The deployment's SMTP server from BASELINE_SMTP_URL, or None when unset."""
    url = os.environ.get("BASELINE_SMTP_URL", "").strip()
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme != "smtp" or not parts.hostname:
        raise ValueError(f"BASELINE_SMTP_URL must be smtp://host:port, not {url!r}")
    return parts.hostname, parts.port or 25


def send_email(server: tuple[str, int], to: list[str], subject: str, text: str) -> Outcome:
    message = EmailMessage()
    message["From"] = os.environ.get("BASELINE_ALERT_FROM", "baseline@localhost")
    message["To"] = ", ".join(to)
    message["Subject"] = subject
    message.set_content(text)
    try:
        with smtplib.SMTP(server[0], server[1], timeout=TIMEOUT_S) as smtp:
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        return Outcome(1, False, f"{type(exc).__name__}: {exc}")
    return Outcome(1, True, None)


def payload(alert: Alert, study: Study, event: str) -> dict[str, Any]:
    return {
        "event": event,
        "alert_id": alert.id,
        "study_id": study.id,
        "study": study.name,
        "rule": alert.rule.value,
        "subject": alert.subject,
        "message": alert.message,
        "fired_at": alert.fired_at.isoformat(),
        "cleared_at": alert.cleared_at.isoformat() if alert.cleared_at else None,
    }


def deliver(session: Session, alert: Alert, event: str) -> list[AlertDelivery]:
    """Send one firing or clearing to the study's recipients and webhook; record each."""
    study = session.get(Study, alert.study_id)
    assert study is not None
    config = settings.load(session, study.id)
    data = payload(alert, study, event)
    rows: list[AlertDelivery] = []
    if config.email_to:
        try:
            server = smtp_server()
        except ValueError as exc:
            server, problem = None, str(exc)
        else:
            problem = "BASELINE_SMTP_URL is not set"
        target = ", ".join(config.email_to)
        if server is None:
            outcome = Outcome(0, False, problem)
        else:
            subject = f"[Baseline {study.name}] {event}: {alert.rule.value} {alert.subject}"
            outcome = send_email(server, config.email_to, subject, _text(data))
        rows.append(_record(alert, "email", event, target, outcome))
    secret = settings.webhook_secret(session, study.id)
    if config.webhook_url and secret:
        outcome = post_webhook(config.webhook_url, secret, data)
        rows.append(_record(alert, "webhook", event, config.webhook_url, outcome))
    session.add_all(rows)
    session.flush()
    return rows


def _text(data: dict[str, Any]) -> str:
    lines = [f"{data['message']}", ""]
    lines += [f"{key}: {value}" for key, value in data.items() if key != "message"]
    return "\n".join(lines) + "\n"


def _record(alert: Alert, channel: str, event: str, target: str, outcome: Outcome) -> AlertDelivery:
    return AlertDelivery(
        alert_id=alert.id,
        channel=channel,
        event=event,
        target=target[:500],
        tries=outcome.tries,
        ok=outcome.ok,
        error=outcome.error,
    )
