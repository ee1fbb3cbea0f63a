"""When a background job that failed for Baseline's own reasons is tried again, and when not.

A reproduction or grading that fails because of Baseline (a workspace that would not start, a
Docker host that stopped answering, a judge endpoint that is down, a crash of the worker) says
nothing about the participant: it is tried again after a doubling back-off, and only after
MAX_TRIES is it marked failed, with its last error, and shown as missing. A participant's own
failure (reproduce.sh exiting non-zero, a solution the scoring script cannot score) is a result
and is never retried.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from baseline.models import Grading, JobStatus, Reproduction, utcnow

log = logging.getLogger(__name__)

MAX_TRIES = 3
RETRY_BACKOFF_S = 30.0  # doubled after each failed try


def count_failed_try(
    row: Reproduction | Grading, message: str, now: datetime | None = None
) -> None:
    """Count one failed try of a running or queued job: back to the queue with a back-off, or
    failed after MAX_TRIES. One log line, no traceback: the error is on the row."""
    now = now or utcnow()
    name = type(row).__name__.lower()
    row.tries = (row.tries or 0) + 1
    if row.tries >= MAX_TRIES:
        row.status = JobStatus.FAILED
        row.error = f"failed {row.tries} times; last error: {message}"
        row.finished_at = now
        row.retry_at = None
        log.error("%s %s failed after %s tries: %s", name, row.id, row.tries, message)
        return
    delay = RETRY_BACKOFF_S * 2 ** (row.tries - 1)
    row.status = JobStatus.QUEUED
    row.retry_at = now + timedelta(seconds=delay)
    row.error = f"try {row.tries} of {MAX_TRIES} failed ({message}); retrying"
    log.warning(
        "%s %s failed (try %s of %s), retrying in %.0f s: %s",
        *(name, row.id, row.tries, MAX_TRIES, delay, message),
    )
