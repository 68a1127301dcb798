"""Holding a claimed run: renewal every lease/3, a control read every 2 s, and the run timeout,
all done by one long-lived :class:`LeaseKeeper` thread per worker, which trips the run's abort
signal when the lease is lost, a cancel is requested or the time is up."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from sync.abort import AbortSignal
from sync.db import Pool, first_line
from sync.queries import QUERIES
from sync.records import Lease
from sync.retry_policy import AbortReason
from sync.settings import Settings

log = logging.getLogger(__name__)


def renew(conn: psycopg.Connection[Any], lease: Lease, seconds: float) -> bool:
    """Extend the lease; False means it is lost."""
    row = conn.execute(
        QUERIES.renew_lease,
        {
            "run_id": lease.run_id,
            "lease_owner": lease.lease_owner,
            "lease": timedelta(seconds=seconds),
        },
    ).fetchone()
    return row is not None


@dataclass(frozen=True)
class Control:
    """What the run's row says: stop (lost or cancelled), or carry on (``stop`` None), and
    until when its shared rate budget is spent."""

    stop: AbortReason | None
    budget_blocked_until: datetime | None = None


def read_control(conn: psycopg.Connection[Any], lease: Lease) -> Control:
    row = conn.execute(
        QUERIES.read_run_control, {"run_id": lease.run_id, "lease_owner": lease.lease_owner}
    ).fetchone()
    if row is None:
        return Control(AbortReason.LEASE_LOST)
    stop = AbortReason.CANCELLED if row["cancel_requested"] else None
    return Control(stop, row["budget_blocked_until"])


@dataclass
class _Watch:
    lease: Lease
    abort: AbortSignal
    deadline: float  # monotonic: the run timeout
    valid_until: float  # monotonic: when the lease runs out unless renewed
    next_renew: float
    next_control: float
    budget: Any = None  # executor.BudgetView: .until, refreshed by each control read
    log: logging.LoggerAdapter[logging.Logger] | logging.Logger = field(default=log)


class LeaseKeeper:
    """One per worker. ``watch()`` a run when it starts, ``release()`` it when it ends."""

    def __init__(
        self, pool: Pool, settings: Settings, *, on_tick: Callable[[], object] | None = None
    ) -> None:
        self._pool = pool
        self._settings = settings
        # Called on every tick while a run is watched: the worker's heartbeat, which its main
        # thread cannot send while it executes the run.
        self._on_tick = on_tick
        self._cond = threading.Condition()
        self._watch: _Watch | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures = 0  # renew/control round trips that failed (a metric)

    def start(self) -> None:
        if self.alive:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def watch(
        self,
        lease: Lease,
        abort: AbortSignal,
        *,
        budget: Any = None,
        logger: logging.LoggerAdapter[logging.Logger] | logging.Logger = log,
    ) -> None:
        now = time.monotonic()
        s = self._settings
        with self._cond:
            self._watch = _Watch(
                lease=lease,
                abort=abort,
                deadline=now + s.run_timeout_seconds,
                valid_until=now + s.lease_seconds,
                next_renew=now + s.renew_interval,
                next_control=now + s.control_interval,
                budget=budget,
                log=logger,
            )
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._watch = None
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._watch is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                watch = self._watch
                assert watch is not None
                due = min(watch.next_renew, watch.next_control, watch.deadline)
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
            try:
                self._tick(watch)
                if self._on_tick is not None:
                    self._on_tick()
            except Exception:  # a bug here must not end the thread: log it and go on
                self.failures += 1
                watch.log.exception("lease keeper tick failed")
                watch.next_control = time.monotonic() + self._settings.control_interval

    def _tick(self, watch: _Watch) -> None:
        now = time.monotonic()
        s = self._settings
        if now >= watch.deadline:
            watch.log.warning("run timed out after %.0f s", s.run_timeout_seconds)
            watch.abort.trip(AbortReason.TIMEOUT)
            watch.deadline = float("inf")
        if now >= watch.next_renew:
            try:
                with self._pool.connection(timeout=5) as conn:
                    renewed = renew(conn, watch.lease, s.lease_seconds)
            except Exception as exc:
                self._failed(watch, "renew", exc)
                watch.next_renew = now + min(5.0, s.renew_interval)
            else:
                watch.next_renew = now + s.renew_interval
                if renewed:
                    watch.valid_until = now + s.lease_seconds
                else:
                    watch.log.warning("lease lost: the renewal matched nothing")
                    watch.abort.trip(AbortReason.LEASE_LOST)
        if now >= watch.next_control:
            watch.next_control = now + s.control_interval
            try:
                with self._pool.connection(timeout=5) as conn:
                    control = read_control(conn, watch.lease)
            except Exception as exc:
                self._failed(watch, "control", exc)
            else:
                if control.stop is not None:
                    watch.log.info("run control says %s", control.stop.value)
                    watch.abort.trip(control.stop)
                if watch.budget is not None and control.budget_blocked_until is not None:
                    current = watch.budget.until
                    if current is None or control.budget_blocked_until > current:
                        watch.budget.until = control.budget_blocked_until
        # Without a renewal we cannot know whether another worker holds the run: stop writing
        # a little before the lease the database knows of runs out.
        if time.monotonic() >= watch.valid_until - min(5.0, s.lease_seconds / 10):
            watch.log.warning("lease lost: could not renew it before it ran out")
            watch.abort.trip(AbortReason.LEASE_LOST)
        if watch.abort.reason is AbortReason.LEASE_LOST:
            # Nothing left to keep; the executor is stopping.
            watch.next_renew = watch.next_control = watch.valid_until = float("inf")

    def _failed(self, watch: _Watch, what: str, exc: Exception) -> None:
        self.failures += 1
        watch.log.warning("lease keeper %s failed: %s", what, first_line(exc))
