"""Run the portal (waitress, a production WSGI server) with the background scheduler."""

from __future__ import annotations

import logging

from baseline.context import Context


def run_server(ctx: Context, host: str, port: int, with_scheduler: bool) -> None:
    from waitress import serve

    from app.factory import create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per scheduler tick ("Running job ...") would drown everything else.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    app = create_app(context=ctx)
    scheduler = None
    if with_scheduler:
        from baseline.scheduler import start_scheduler

        scheduler = start_scheduler(ctx)
    print(f"Baseline portal on http://{host}:{port}/  (health: /api/v1/health)", flush=True)
    try:
        serve(app, host=host, port=port, threads=8, ident="baseline")
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=False)
