"""Run the portal (waitress, a production WSGI server) with the background scheduler."""

from __future__ import annotations

import errno
import logging
import signal
import sys
from typing import TYPE_CHECKING

from baseline.context import Context
from infra import listen_ports

if TYPE_CHECKING:
    from baseline.demo.live_demo import DemoNotice


def _portal_port_taken(host: str, port: int) -> listen_ports.PortInUse:
    return listen_ports.PortInUse(
        "port", host, port, "another Baseline portal or demo?", "choose another with --port"
    )


def check_port(host: str, port: int) -> None:
    """Fail at once when the portal's port is taken, before anything is seeded or started (the
    demo seeded its studies and launched its workspaces, then said only "Address already in
    use")."""
    if not listen_ports.is_free(host, port):
        raise _portal_port_taken(host, port)


def run_server(
    ctx: Context,
    host: str,
    port: int,
    with_scheduler: bool,
    with_hub: bool = False,
    with_worker: bool = False,
    notice: DemoNotice | None = None,
) -> None:
    from waitress.server import create_server

    from app.factory import DEMO_NOTICE, create_app

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per scheduler tick ("Running job ...") would drown everything else.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    # Checked, not held: until the server binds, a client is refused at once rather than left
    # waiting on a port nothing answers yet (health probes time out so).
    check_port(host, port)
    hub_settings = None
    if with_hub:
        from baseline.hub_settings import hub_config
        from infra.hub.supervisor import stop_left_behind

        hub_settings = hub_config(ctx.settings, starting=True)
        stop_left_behind(hub_settings)  # by a portal of this home that was killed
        hub_settings.check_ports()
    app = create_app(context=ctx)
    app.config[DEMO_NOTICE] = notice
    scheduler = None
    if with_scheduler:
        from baseline.jobs.scheduler import lead_scheduler

        # Only one of several portal processes on one database runs it (leader election).
        scheduler = lead_scheduler(ctx)
    # `task` inside the workspaces reaches this portal through the relay (any egress policy).
    from baseline.workspaces.attempt_tokens import portal_relay

    relay = portal_relay(ctx, port)
    relay.start()
    hub = None
    if hub_settings is not None:
        from infra.hub.supervisor import HubSupervisor

        hub = HubSupervisor(hub_settings)
        hub.start()
        print(f"JupyterHub on {hub.config.public_url}/hub/  (log: {hub.log_file})", flush=True)
    worker = None
    if with_worker:
        from baseline.jobs.worker_process import WorkerSupervisor

        worker = WorkerSupervisor(ctx.settings.home / "agent-worker.log")
        worker.start()
        print(f"agent worker running (log: {worker.log_file})", flush=True)
    # A plain SIGTERM must stop what this process started (the hub and the worker run in their
    # own sessions; the egress proxies are its children, stopped at exit): exit through the
    # `finally` below and the exit handlers instead of dying with them left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        try:
            server = create_server(app, host=host, port=port, threads=8, ident="baseline")
        except OSError as exc:  # taken since the check: what started is stopped below
            if exc.errno == errno.EADDRINUSE:
                raise _portal_port_taken(host, port) from exc
            raise
        print(f"Baseline portal on http://{host}:{port}/  (health: /api/v1/health)", flush=True)
        server.run()
    finally:
        if worker is not None:
            worker.stop()
        relay.stop()
        if hub is not None:
            hub.stop()
        if scheduler is not None:
            scheduler.end()
