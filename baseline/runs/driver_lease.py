"""Exactly one driver per agent attempt: a lease in the database.

Two drivers on one attempt (the worker of `serve` and an `agent run` typed beside it) each read
the transcript, each took steps, and one marked the other's running tool call interrupted. So a
driver first takes the attempt's lease (`agent_driver_leases`): the row names its holder (host,
process, thread) and holds until `expires_at`. A second driver finds the row held and refuses,
naming the holder. The holder renews the lease while it drives, from a thread of its own so
that a long tool call does not let it lapse; a holder that died stops renewing, and once its
lease has expired the next driver takes it over (and resumes the run where its transcript ends).
A holder that finds its lease taken (it stalled past the expiry) stops driving at its next step.

Before an act that must happen at most once (a model call: the built-in loop's, and a command
agent's through the relay with its answer), a driver `fence`s: it renews its lease in the database
and acts only when that conditional UPDATE found it still the holder. The holder's name is unique to
the driver (a random suffix), so it is the fencing token; and having just renewed, the driver keeps
the attempt for a whole TTL after the fence, so no other driver can take it over between the fence
and the act unless this one stalls for longer than the TTL right there (which a dead driver and a
stalled one cannot be told apart by: the new driver must take the dead one's requests over).

Taking and renewing are each one conditional UPDATE (or the first INSERT), atomic on SQLite and
PostgreSQL alike: no driver can take a lease another one holds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, update
from sqlalchemy.exc import IntegrityError

from baseline.context import Context
from baseline.db import rows_changed
from baseline.errors import Conflict
from baseline.models import AgentDriverLease, utcnow

log = logging.getLogger(__name__)

LEASE_TTL_S = 60.0  # how long a holder that stopped renewing keeps the attempt
RENEW_EVERY_S = 15.0  # well inside the TTL: a busy database does not make a live holder lose it


class DriverBusy(Conflict):
    """Another driver holds the attempt's lease."""


class DriverLost(Conflict):
    """This driver's lease lapsed and another driver took the attempt: it must stop."""


def unchecked() -> None:
    """The lease check of a driver made without a lease (`AgentLoop` or `CommandAgent` built
    directly, as their tests do): `agent_worker.run_agent` passes the lease's `check` (before
    the loop's transcript writes) and `fence` (before its model calls, and a command agent's
    relay's)."""


def holder_name(role: str) -> str:
    """Who a new driver is, as a second driver's refusal names it."""
    thread = threading.current_thread().name
    return f"{role} on {socket.gethostname()} pid {os.getpid()} ({thread}, {uuid.uuid4().hex[:8]})"


def acquire(
    ctx: Context, attempt_id: int, holder: str, *, ttl_s: float = LEASE_TTL_S,
    now: datetime | None = None,
) -> datetime | None:  # fmt: skip
    """Take the attempt's lease for `holder`: free, expired, or its own already. Raises
    `DriverBusy` naming the holder while another one's lease holds. Returns the last renewal of
    the dead holder whose expired lease it took over (None otherwise): from then on nobody drove.
    """
    now = now or utcnow()
    expires = now + timedelta(seconds=ttl_s)
    with ctx.session() as session:
        current = session.get(AgentDriverLease, attempt_id)
        if current is None:
            session.add(
                AgentDriverLease(
                    attempt_id=attempt_id,
                    holder=holder,
                    acquired_at=now,
                    renewed_at=now,
                    expires_at=expires,
                )
            )
            try:
                session.flush()
                return None
            except IntegrityError:  # another driver inserted it first
                session.rollback()
                current = session.get(AgentDriverLease, attempt_id)
        elif current.holder == holder or current.expires_at <= now:
            previous, dead_since = current.holder, current.renewed_at
            taken = rows_changed(
                session.execute(
                    update(AgentDriverLease)
                    .where(
                        AgentDriverLease.attempt_id == attempt_id,
                        AgentDriverLease.holder == previous,
                        or_(AgentDriverLease.holder == holder, AgentDriverLease.expires_at <= now),
                    )
                    .values(holder=holder, acquired_at=now, renewed_at=now, expires_at=expires)
                    .execution_options(synchronize_session=False)
                )
            )
            if taken:
                return None if previous == holder else dead_since
            session.expire_all()
            current = session.get(AgentDriverLease, attempt_id)
        if current is None:
            raise DriverBusy(f"attempt {attempt_id}: its driver lease is being taken; try again")
        raise DriverBusy(
            f"attempt {attempt_id} is driven by {current.holder} (lease until "
            f"{current.expires_at.isoformat(timespec='seconds')}); not driving it twice"
        )


def renew(
    ctx: Context, attempt_id: int, holder: str, *, ttl_s: float = LEASE_TTL_S,
    now: datetime | None = None,
) -> bool:  # fmt: skip
    """Extend `holder`'s lease; False when it is no longer the holder."""
    now = now or utcnow()
    with ctx.session() as session:
        return bool(
            rows_changed(
                session.execute(
                    update(AgentDriverLease)
                    .where(
                        AgentDriverLease.attempt_id == attempt_id,
                        AgentDriverLease.holder == holder,
                    )
                    .values(renewed_at=now, expires_at=now + timedelta(seconds=ttl_s))
                    .execution_options(synchronize_session=False)
                )
            )
        )


def release(ctx: Context, attempt_id: int, holder: str) -> None:
    """Give the lease up (only `holder`'s own): the next driver need not wait for its expiry."""
    with ctx.session() as session:
        session.execute(
            delete(AgentDriverLease)
            .where(AgentDriverLease.attempt_id == attempt_id, AgentDriverLease.holder == holder)
            .execution_options(synchronize_session=False)
        )


@dataclass
class Lease:
    """A held lease, renewed from its own thread until `close`; `check` raises `DriverLost` once
    another driver has taken the attempt (the driver calls it before every step)."""

    ctx: Context
    attempt_id: int
    holder: str
    ttl_s: float = LEASE_TTL_S
    renew_every_s: float = RENEW_EVERY_S
    dead_since: datetime | None = None  # the dead holder's last renewal, when taken over
    lost: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.attempt_id}", daemon=True
        )

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                if not renew(self.ctx, self.attempt_id, self.holder, ttl_s=self.ttl_s):
                    self._lose()
                    return
            except Exception:  # a database hiccup: the next round tries again within the TTL
                log.exception("attempt %s: driver lease not renewed", self.attempt_id)

    def _lose(self) -> None:
        if not self.lost:
            log.warning("attempt %s: %s no longer holds the driver lease (another driver took "
                        "it over); it stops driving", self.attempt_id, self.holder)  # fmt: skip
        self.lost = True

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        if self.lost:
            raise DriverLost(
                f"attempt {self.attempt_id}: this driver's lease was taken over; it stops"
            )

    def fence(self) -> None:
        """`check` confirmed in the database, where the renewer's last round may be 15 s old:
        renew now and raise `DriverLost` unless this driver is still the holder. Called right
        before an act that must not happen twice (see the module's docstring)."""
        if not self.lost and not renew(self.ctx, self.attempt_id, self.holder, ttl_s=self.ttl_s):
            self._lose()
        self.check()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if not self.lost:
            release(self.ctx, self.attempt_id, self.holder)


def hold(
    ctx: Context, attempt_id: int, role: str, *, ttl_s: float = LEASE_TTL_S,
    renew_every_s: float = RENEW_EVERY_S,
) -> Lease:  # fmt: skip
    """Take the attempt's lease (`DriverBusy` when another driver holds it) and keep renewing
    it; close the returned `Lease` when done driving."""
    holder = holder_name(role)
    dead_since = acquire(ctx, attempt_id, holder, ttl_s=ttl_s)
    lease = Lease(ctx, attempt_id, holder, ttl_s=ttl_s, renew_every_s=renew_every_s,
                  dead_since=dead_since)  # fmt: skip
    lease.start()
    return lease
