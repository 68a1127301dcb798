"""Holding leased work: renewal every lease/3, a control read every 2 s, and a timeout, for any
number of leases of any kind at once, all done by one :class:`LeaseKeeper` thread per worker on a
connection of its own. It trips a lease's abort signal when the lease is lost, its work is
cancelled or its time is up.

Every kind of leased work (a connection's run, an application job, a document ingestion) is a
row with a lease owner (the claim's fencing token) and an expiry. A kind tells the keeper how to
renew and how to read the control of one of its rows (:class:`LeaseKind`, defined in the kind's
own package); the keeper does the rest the same way for all of them, and knows none of them.

The keeper never borrows from the worker's pool: a worker whose lanes hold every pooled
connection still renews its leases on time, so no lease is lost (and no second worker let in)
because the pool was busy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from sync.base.abort import AbortReason, AbortSignal
from sync.base.settings import Settings
from sync.store.db import Connection, connect, first_line
from sync.store.rows import Lease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Control:
    """What a leased row says: stop (lost or cancelled), or carry on (``stop`` None)."""

    stop: AbortReason | None


@dataclass(frozen=True)
class LeaseKind:
    """How the keeper holds one kind of leased work. ``renew`` extends the lease and returns
    False when it is lost (expired, or claimed by another worker); ``control`` reads whether
    the holder must stop. Both take the keeper's own connection."""

    name: str
    renew: Callable[[Connection, Lease, timedelta], bool]
    control: Callable[[Connection, Lease], Control]
    # The same for many leases in one statement each (the leases renewed; a control per
    # lease), for kinds a worker holds many of at once; None: one statement per lease.
    renew_many: Callable[[Connection, list[tuple[Lease, timedelta]]], set[Lease]] | None = None
    control_many: Callable[[Connection, list[Lease]], dict[Lease, Control]] | None = None


@dataclass(frozen=True)
class Terms:
    """How long a lease lasts, how often it is renewed and controlled, and how long the work
    may run in all. Renewal comes at a third of the lease, so two renewals can fail before it
    runs out."""

    lease_seconds: float
    control_interval: float
    timeout_seconds: float

    @property
    def renew_interval(self) -> float:
        return self.lease_seconds / 3

    @classmethod
    def of_runs(cls, settings: Settings) -> Terms:
        return cls(settings.lease_seconds, settings.control_interval, settings.run_timeout_seconds)


@dataclass(eq=False, slots=True)
class Watch:
    """One lease the keeper holds, from ``watch()`` until ``release()``."""

    kind: LeaseKind
    lease: Lease
    abort: AbortSignal
    terms: Terms
    deadline: float  # monotonic: the timeout
    valid_until: float  # monotonic: when the lease runs out unless renewed
    next_renew: float
    next_control: float
    on_control: Callable[[Control], object] | None = None
    log: logging.LoggerAdapter[logging.Logger] | logging.Logger = field(default=log)
    renewals: int = 0  # renewals that extended the lease

    @property
    def due(self) -> float:
        return min(self.next_renew, self.next_control, self.deadline)


def _slack(watch: Watch) -> float:
    """How early a lease of a kind held many at once is renewed or controlled, to share the
    statement of the others due about then: half a control interval. Early is harmless (a
    renewal only extends), and a lease once ticked with the others stays in step with them."""
    return watch.terms.control_interval / 2 if watch.kind.renew_many is not None else 0.0


def _by_kind(watches: list[Watch]) -> dict[LeaseKind, list[Watch]]:
    grouped: dict[LeaseKind, list[Watch]] = {}
    for watch in watches:
        grouped.setdefault(watch.kind, []).append(watch)
    return grouped


class LeaseKeeper:
    """One per worker. ``watch()`` a lease when its work starts, ``release()`` it when the work
    ends; any number may be watched at once, from any thread.

    ``connect`` opens the keeper's own connection (reopened after a failure); ``on_tick`` is
    called after each round of ticks, outside the keeper's lock."""

    def __init__(
        self,
        settings: Settings,
        connect: Callable[[], Connection],
        *,
        on_tick: Callable[[], object] | None = None,
    ) -> None:
        self._settings = settings
        self._connect = connect
        self._on_tick = on_tick
        self._cond = threading.Condition()
        self._watches: set[Watch] = set()
        self._wakes_at = float("-inf")  # when the thread's sleep ends (-inf: it is awake)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._conn: Connection | None = None
        self.failures = 0  # renew/control round trips that failed (a metric)
        self.renewals: dict[str, int] = {}  # renewals that extended a lease, per kind
        self.losses: dict[str, int] = {}  # leases found lost, per kind

    @classmethod
    def for_url(
        cls, settings: Settings, url: str, *, on_tick: Callable[[], object] | None = None
    ) -> LeaseKeeper:
        return cls(settings, lambda: connect(settings, url, purpose="lease"), on_tick=on_tick)

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
        self._close_connection()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def watched(self) -> int:
        with self._cond:
            return len(self._watches)

    def watch(
        self,
        lease: Lease,
        abort: AbortSignal,
        *,
        kind: LeaseKind,
        terms: Terms | None = None,
        on_control: Callable[[Control], object] | None = None,
        logger: logging.LoggerAdapter[logging.Logger] | logging.Logger = log,
    ) -> Watch:
        """Hold ``lease`` from now on (its claim has just set it to ``terms.lease_seconds``)."""
        terms = terms or Terms.of_runs(self._settings)
        watch = self._watch(lease, abort, kind, terms, time.monotonic(), on_control, logger)
        self._add([watch])
        return watch

    def watch_all(
        self, leases: Sequence[tuple[Lease, AbortSignal, Terms]], *, kind: LeaseKind
    ) -> list[Watch]:
        """Hold the leases a claim has just taken (a batch's jobs), added under one lock."""
        now = time.monotonic()
        watches = [
            self._watch(lease, abort, kind, terms, now, None, log) for lease, abort, terms in leases
        ]
        self._add(watches)
        return watches

    def _watch(
        self,
        lease: Lease,
        abort: AbortSignal,
        kind: LeaseKind,
        terms: Terms,
        now: float,
        on_control: Callable[[Control], object] | None,
        logger: logging.LoggerAdapter[logging.Logger] | logging.Logger,
    ) -> Watch:
        return Watch(
            kind=kind,
            lease=lease,
            abort=abort,
            terms=terms,
            deadline=now + terms.timeout_seconds,
            valid_until=now + terms.lease_seconds,
            next_renew=now + terms.renew_interval,
            next_control=now + terms.control_interval,
            on_control=on_control,
            log=logger,
        )

    def _add(self, watches: list[Watch]) -> None:
        if not watches:
            return
        first_due = min(watch.due for watch in watches)
        with self._cond:
            self._watches.update(watches)
            # Wake the thread only if it sleeps past these leases' first tick: many short
            # leases (a worker's lanes) must not wake it once each.
            if first_due < self._wakes_at:
                self._cond.notify_all()

    def release(self, watch: Watch) -> None:
        self.release_all([watch])

    def release_all(self, watches: Sequence[Watch]) -> None:
        # No wake-up: the thread finds the leases gone at its next tick.
        with self._cond:
            self._watches.difference_update(watches)

    # -- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._watches and not self._stopping:
                    self._wakes_at = float("inf")
                    self._cond.wait()
                if self._stopping:
                    return
                wait = min(w.due for w in self._watches) - time.monotonic()
                if wait > 0:
                    self._wakes_at = time.monotonic() + wait
                    self._cond.wait(wait)
                    self._wakes_at = float("-inf")  # awake: it looks at every lease again
                    continue
                self._wakes_at = float("-inf")
                now = time.monotonic()
                due = [w for w in self._watches if w.due <= now + _slack(w)]
            for kind, watches in _by_kind(due).items():
                try:
                    if kind.renew_many is not None:
                        self._tick_many(kind, watches)
                    else:
                        for watch in watches:
                            self._tick(watch)
                except Exception:  # a bug here must not end the thread: log it and go on
                    self.failures += 1
                    log.exception("lease keeper tick failed")
                    for watch in watches:
                        watch.next_control = time.monotonic() + watch.terms.control_interval
            if self._on_tick is not None:
                try:
                    self._on_tick()
                except Exception:
                    log.exception("lease keeper: on_tick failed")

    def _tick(self, watch: Watch) -> None:
        now = time.monotonic()
        self._check_timeout(watch, now)
        if now >= watch.next_renew:
            length = timedelta(seconds=watch.terms.lease_seconds)
            try:
                renewed = self._call(lambda c: watch.kind.renew(c, watch.lease, length))
            except Exception as exc:
                self._failed(watch, "renew", exc)
                self._renew_failed(watch, now)
            else:
                self._renewed(watch, renewed, now)
        if now >= watch.next_control:
            watch.next_control = now + watch.terms.control_interval
            try:
                control = self._call(lambda c: watch.kind.control(c, watch.lease))
            except Exception as exc:
                self._failed(watch, "control", exc)
            else:
                self._controlled(watch, control)
        self._check_valid(watch)

    def _tick_many(self, kind: LeaseKind, watches: list[Watch]) -> None:
        """``_tick`` of many leases of one kind: their control reads in one statement, then
        their renewals in another. Controls first: a lease whose job was cancelled is told so,
        and not renewed (its renewal would only find it no longer active)."""
        assert kind.renew_many is not None and kind.control_many is not None
        renew_many, control_many = kind.renew_many, kind.control_many
        now = time.monotonic()
        for watch in watches:
            self._check_timeout(watch, now)
        stopped: set[int] = set()
        controlling = [w for w in watches if now + _slack(w) >= w.next_control]
        if controlling:
            for watch in controlling:
                watch.next_control = now + watch.terms.control_interval
            try:
                controls = self._call(lambda c: control_many(c, [w.lease for w in controlling]))
            except Exception as exc:
                self._failed(controlling[0], f"control of {len(controlling)} leases", exc)
            else:
                for watch in controlling:
                    control = controls[watch.lease]
                    self._controlled(watch, control)
                    if control.stop in (AbortReason.CANCELLED, AbortReason.LEASE_LOST):
                        stopped.add(id(watch))  # its holder is stopping: no renewal now
                        watch.next_renew = max(watch.next_renew, now + watch.terms.renew_interval)
        renewing = [w for w in watches if now + _slack(w) >= w.next_renew and id(w) not in stopped]
        if renewing:
            leases = [(w.lease, timedelta(seconds=w.terms.lease_seconds)) for w in renewing]
            try:
                renewed = self._call(lambda c: renew_many(c, leases))
            except Exception as exc:
                self._failed(renewing[0], f"renew of {len(renewing)} leases", exc)
                for watch in renewing:
                    self._renew_failed(watch, now)
            else:
                for watch in renewing:
                    self._renewed(watch, watch.lease in renewed, now)
        for watch in watches:
            self._check_valid(watch)

    def _check_timeout(self, watch: Watch, now: float) -> None:
        if now >= watch.deadline:
            name = watch.kind.name
            watch.log.warning("%s timed out after %.0f s", name, watch.terms.timeout_seconds)
            watch.abort.trip(AbortReason.TIMEOUT)
            watch.deadline = float("inf")

    def _renew_failed(self, watch: Watch, now: float) -> None:
        watch.next_renew = now + min(5.0, watch.terms.renew_interval)

    def _renewed(self, watch: Watch, renewed: bool, now: float) -> None:
        watch.next_renew = now + watch.terms.renew_interval
        if renewed:
            name = watch.kind.name
            watch.valid_until = now + watch.terms.lease_seconds
            watch.renewals += 1
            self.renewals[name] = self.renewals.get(name, 0) + 1
        else:
            watch.log.warning("lease lost: the renewal matched nothing")
            self._lost(watch)

    def _controlled(self, watch: Watch, control: Control) -> None:
        name = watch.kind.name
        if control.stop is AbortReason.LEASE_LOST:
            watch.log.warning("lease lost: the %s's row is no longer held", name)
            self._lost(watch)
        elif control.stop is not None:
            watch.log.info("%s control says %s", name, control.stop.value)
            watch.abort.trip(control.stop)
        if watch.on_control is not None:
            watch.on_control(control)

    def _check_valid(self, watch: Watch) -> None:
        # Without a renewal we cannot know whether another worker holds the row: stop writing
        # a little before the lease the database knows of runs out.
        terms = watch.terms
        if time.monotonic() >= watch.valid_until - min(5.0, terms.lease_seconds / 10):
            watch.log.warning("lease lost: could not renew it before it ran out")
            self._lost(watch)
        if watch.abort.reason is AbortReason.LEASE_LOST:
            # Nothing left to keep; the holder is stopping.
            watch.next_renew = watch.next_control = watch.valid_until = float("inf")

    def _lost(self, watch: Watch) -> None:
        if watch.abort.reason is not AbortReason.LEASE_LOST:
            name = watch.kind.name
            self.losses[name] = self.losses.get(name, 0) + 1
        watch.abort.trip(AbortReason.LEASE_LOST)

    def _call(self, statement: Callable[[Connection], Any]) -> Any:
        """One statement on the keeper's own connection, opened on first use and reopened after
        a failure (the failure itself is the caller's)."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            return statement(self._conn)
        except psycopg.Error:
            self._close_connection()
            raise

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _failed(self, watch: Watch, what: str, exc: Exception) -> None:
        self.failures += 1
        watch.log.warning("lease keeper %s failed: %s", what, first_line(exc))
