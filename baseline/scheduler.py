"""The background scheduler (APScheduler 3.x) that runs in the portal's process.

Jobs persist in the study database through APScheduler's SQLAlchemy job store, so due work
survives a restart of the portal.
"""

from __future__ import annotations

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from baseline.context import Context


def make_scheduler(ctx: Context) -> BackgroundScheduler:
    return BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=ctx.engine, tablename="scheduler_jobs")},
        job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
        timezone="UTC",
    )


def start_scheduler(ctx: Context) -> BackgroundScheduler:
    scheduler = make_scheduler(ctx)
    scheduler.start()
    return scheduler
