"""Slots: a worker runs each kind of leased work in a slot of its own, a kind and how many of its
units at once (its lanes). The worker's loop runs the main slot (sync runs, one at a time);
lane slots run their units on threads of their own (one per lane), so a six-hour ingestion
holds up no sync, and an application queue's jobs run beside both.

Per slot, one idle lane at a time is the *poller*: it claims (for a kind that claims ahead, for
every lane not running a unit and as many again to start while its next claim is on the way,
each held by the lease keeper from the claim on; else one unit), hands the rest to the other
lanes as they come free, and when nothing is due waits for a wake-up (a NOTIFY of the slot's
queue, through the worker's listener) or the poll interval. A slot whose claims overlap (a
claim takes one unit, a batch) has one thread more than its lanes, and while claims find work
a second idle thread claims beside the poller: one claim's statement runs on the server while
the other's rows are read, and a unit claimed while every lane is busy waits, held, for the
first free one. Each unit runs through the worker's one executor.

Without threads (``Worker.poll()`` in tests, ``worker --once``) a lane slot runs one unit per
poll, in the caller's thread (:meth:`Slot.run_once`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from sync.base.signals import TestSignal
from sync.jobs.executor import Executor, Held
from sync.jobs.metrics import WorkerMetrics
from sync.jobs.registry import SlotSpec
from sync.store.db import first_line

log = logging.getLogger("sync.slots")

# Seconds before a lane tries again after a claim failed (the database is down). Not a setting:
# it only keeps a failing lane from spinning, and a lane's next claim waits for the database
# anyway (the pool's own timeout).
RETRY_AFTER = 0.5

# Claims at once in a slot whose claims overlap: while one's statement runs on the server, the
# other's rows are read. More would take more pooled connections and gain nothing.
OVERLAPPING_CLAIMS = 2

# Seconds between a lane slot's claims in polls whose main slot ran a unit: a caller polling
# through a backlog of sync runs pays no claim of an empty ingestion or queue at each run.
LOOK_WHILE_BUSY = 1.0


@dataclass(eq=False)
class _Claimed:
    unit: Any
    held: Held


class Slot:
    """One kind's lanes in a worker. ``start()`` them, ``wake()`` on a NOTIFY, ``stop()`` at
    shutdown (running units see their abort signal tripped by the executor; claimed units not
    started go back)."""

    def __init__(
        self,
        spec: SlotSpec,
        executor: Executor,
        *,
        poll_interval: float,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.spec = spec
        self.kind = spec.kind
        self._executor = executor
        self._poll_interval = poll_interval
        self._metrics = metrics
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._lane_free = threading.Condition(lock)  # a unit ended: a claimed one may start
        self._claimed: deque[_Claimed] = deque()  # claimed, not started yet
        self._pollers = 0  # threads claiming, or waiting for work as the slot's poller
        self._found = False  # the last claim found work
        self._woken = False  # a wake-up came while the poller waited
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._running_now: set[_Claimed] = set()  # by identity: units compare by value
        self.claims = 0  # claim round trips
        self.units_run = 0
        self.failures = 0  # claims that failed, and units whose run raised
        self.claimed = TestSignal()  # emitted after each claim round trip
        self._last_look = float("-inf")  # time.monotonic() of run_once's last claim

    @property
    def running(self) -> list[Any]:
        """The units running now."""
        with self._cond:
            return [claimed.unit for claimed in self._running_now]

    @property
    def started(self) -> bool:
        return bool(self._threads)

    @property
    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def start(self) -> None:
        self._stopping.clear()
        self._executor.start()
        self.kind.start()
        threads = self.spec.lanes + (1 if self.spec.claims_overlap else 0)
        for number in range(1, threads + 1):
            thread = threading.Thread(
                target=self._lane, name=f"{self.kind.name}-{self._scope or 'lane'}-{number}"
            )
            thread.daemon = True
            self._threads.append(thread)
            thread.start()

    def wake(self) -> None:
        """Work of this slot may be due: its poller claims now."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            self._lane_free.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        self._threads.clear()
        while self._claimed:
            self._hand_back(self._claimed.popleft())
        self.kind.stop()

    def run_once(self, *, busy: bool = False) -> bool:
        """Claim one unit and run it in this thread; True if there was one. ``busy``: the
        worker's main slot ran a unit in this poll; then claim at most once per
        ``LOOK_WHILE_BUSY`` seconds."""
        if self._stopping.is_set():
            return False
        now = time.monotonic()
        if busy and now - self._last_look < LOOK_WHILE_BUSY:
            return False
        self._last_look = now
        claimed = self._claim(1, raising=True)
        for extra in claimed[1:]:
            self._hand_back(extra)
        if not claimed:
            return False
        self._run(claimed[0])
        return True

    # -- a lane ----------------------------------------------------------------------------

    @property
    def _scope(self) -> str:
        return self.spec.wakes_on or ""

    def _lane(self) -> None:
        while not self._stopping.is_set():
            try:
                claimed = self._next()
                if claimed is not None:
                    self._run(claimed)
            except Exception:  # a bug must not end the lane quietly: log it and go on
                self.failures += 1
                log.exception("a lane of %s failed", self.kind.name)
                self._stopping.wait(RETRY_AFTER)

    def _next(self) -> _Claimed | None:
        """What this lane runs next: a unit already claimed for it, or, as the slot's poller, a
        fresh claim; None after waiting for a wake-up or the poll interval."""
        with self._cond:
            while True:
                if self._stopping.is_set():
                    return None
                if self._claimed:
                    return self._claimed.popleft()
                overlap = self._found and self.spec.claims_overlap
                if not self._pollers or (overlap and self._pollers < OVERLAPPING_CLAIMS):
                    self._pollers += 1
                    break
                self._cond.wait()
            lanes = self.spec.lanes
            limit = 1
            if self.spec.claims_ahead and lanes > 1:
                limit = max(lanes - len(self._running_now) + lanes - len(self._claimed), 1)
            self._woken = False
        claimed = self._claim(limit)
        with self._cond:
            self._pollers -= 1
            self._found = bool(claimed)
            if claimed:
                self._claimed.extend(claimed[1:])
                # As many waiting lanes as there are units for them, and one to claim next.
                self._cond.notify(len(claimed))
                return claimed[0]
            if not self._woken and not self._stopping.is_set():
                self._cond.wait(self._poll_interval)
            return None

    def _claim(self, limit: int, *, raising: bool = False) -> list[_Claimed]:
        """Claim up to ``limit`` units, held from the claim on. A failed claim raises with
        ``raising`` (a poll's stage counts it); a lane logs it and waits a moment."""
        began = time.monotonic()
        try:
            units = self.kind.claim(limit)
            # Held from the claim on, also while they wait for a lane.
            claimed = [_Claimed(unit, self._executor.hold(self.kind, unit)) for unit in units]
        except Exception as exc:
            self.failures += 1
            if raising:
                raise
            log.warning("claim of %s failed: %s", self.kind.name, first_line(exc))
            self._stopping.wait(RETRY_AFTER)
            return []
        finally:
            self.claims += 1
            self.claimed.emit()
        if self._metrics is not None:
            took = time.monotonic() - began
            self._metrics.claimed(self.kind.name, self._scope, len(claimed), took)
        return claimed

    def _run(self, claimed: _Claimed) -> None:
        with self._cond:
            while len(self._running_now) >= self.spec.lanes and not self._stopping.is_set():
                self._lane_free.wait()
            start = not self._stopping.is_set() and not claimed.held.abort.is_set
            if start:
                self._running_now.add(claimed)
        if not start:
            self._hand_back(claimed)
            return
        try:
            self._executor.run(self.kind, claimed.unit, claimed.held)
            self.units_run += 1
        finally:
            with self._cond:
                self._running_now.discard(claimed)
                self._lane_free.notify()

    def _hand_back(self, claimed: _Claimed) -> None:
        self._executor.release(claimed.held)
        try:
            self.kind.hand_back(claimed.unit)
        except Exception as exc:  # its lease expires and another worker takes it
            log.warning("could not hand back a claimed %s: %s", self.kind.name, first_line(exc))
