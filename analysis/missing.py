"""Why a score is missing, and the one place where a missing value may be filled.

Every measurement that cannot stand as a score carries a reason. The statistics exclude it (a
NaN, never a 0) and the figures count it. Filling is limited to carry-forward of an attempt's
last usable score over the checkpoints after it ended, which is only done when the caller asks
for it; the trajectories then mark those points ``carried_forward`` and the figures say so.
"""

from __future__ import annotations

import enum
from typing import Any

from baseline.models import Grading, JobStatus, Reproduction


class MissingReason(enum.StrEnum):
    ENDED_EARLY = "ended_early"  # the attempt ended before this checkpoint
    NO_SNAPSHOT = "no_snapshot"  # the checkpoint was passed but no snapshot exists for it
    NOT_GRADED = "not_graded"  # no grading yet (or one still queued/running)
    GRADING_FAILED = "grading_failed"
    GRADING_INCOMPLETE = "grading_incomplete"  # status incomplete, or invalid leaves
    REPRODUCTION_FAILED = "reproduction_failed"  # reproduction job failed, nothing to grade
    SCORE_ERROR = "score_error"  # an intermediate scoring run reported an error


class PointState(enum.StrEnum):
    """How a trajectory point got its value."""

    OBSERVED = "observed"
    BEST_SO_FAR = "best_so_far"  # the best score logged by then (scored tasks)
    CARRIED_FORWARD = "carried_forward"  # last usable score after the attempt ended
    MISSING = "missing"


def grading_missing_reason(grading: Grading | None, repro: Reproduction | None) -> str | None:
    """The reason a snapshot's chosen grading cannot stand as its score, or None when it can."""
    if grading is None:
        if repro is not None and repro.status is JobStatus.FAILED:
            return MissingReason.REPRODUCTION_FAILED.value
        return MissingReason.NOT_GRADED.value
    if grading.status is JobStatus.FAILED:
        return MissingReason.GRADING_FAILED.value
    if grading.status is JobStatus.INCOMPLETE or grading.leaves_invalid > 0:
        return MissingReason.GRADING_INCOMPLETE.value
    if grading.status is not JobStatus.SUCCEEDED or grading.score is None:
        return MissingReason.NOT_GRADED.value
    return None


def reason_counts(reasons: list[Any]) -> dict[str, int]:
    """How many points are missing (or at the floor), by reason, for captions and hover text;
    empty values (None, NaN, "") are not reasons."""
    counts: dict[str, int] = {}
    for reason in reasons:
        if isinstance(reason, str) and reason:
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items()))
