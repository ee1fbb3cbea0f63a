"""Trajectories, statistics, plots and exports of study results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.table import StudyData, load_from_session

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from baseline.context import Context

__all__ = ["StudyData", "load_study"]


def load_study(
    study: str | int,
    *,
    session: Session | None = None,
    context: Context | None = None,
    hourly_rate: float | None = None,
    url: str | None = None,
    token: str | None = None,
) -> StudyData:
    """The study's tidy table and settings, by name or id: ``from analysis import load_study``.

    With ``url`` (and an API ``token``) it loads the study from that portal's API; otherwise,
    without a session, it opens the configured database (``BASELINE_HOME``/``BASELINE_CONFIG``),
    as `baseline` commands do.
    """
    from baseline.studies.studies import find_study

    if url is not None:
        from analysis.remote import load_remote
        from baseline.portal_client import PortalClient

        return load_remote(PortalClient(url, token or ""), study, hourly_rate)

    if session is not None:
        return load_from_session(session, find_study(session, str(study)), hourly_rate)
    from baseline.context import Context

    ctx = context or Context.from_settings()
    with ctx.session() as own:
        return load_from_session(own, find_study(own, str(study)), hourly_rate)
