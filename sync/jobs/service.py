"""What every worker service shares: ``run_once()`` does the work once, ``run_if_due()`` does it
when its interval has passed, and ``start()``/``stop()`` run it on a timer thread of its own, so
a run that executes for hours never starves it.

A service never dies quietly: an exception in its work is logged, counted in ``failures`` and
retried (after a backoff up to ``Settings.max_backoff`` while it keeps failing), and the thread is
watched by the worker, which starts it again should it ever end (``alive``). Tests wait on its
``signals`` instead of sleeping, or call ``run_once()`` directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from sync.base.signals import TestSignal
from sync.store.db import first_line

T = TypeVar("T")

log = logging.getLogger("sync.worker.services")

Ticks = Callable[[], float]
"""Seconds on a monotonic scale; ``time.monotonic`` unless a test drives it."""


class ServiceSignals:
    """``ran``: a ``run_once`` finished (whether or not it found work); ``failed``: one raised."""

    def __init__(self) -> None:
        self.ran = TestSignal()
        self.failed = TestSignal()


class Service(Generic[T]):
    """A periodic task of the worker. Subclasses set ``name`` and implement ``_run()``."""

    name = "service"

    def __init__(self, interval: float, max_backoff: float, *, clock: Ticks = time.monotonic):
        self.interval = interval
        self._max_backoff = max_backoff
        self._clock = clock
        self._last_run = float("-inf")  # on the clock: when run_once last started
        self._lock = threading.Lock()  # one run at a time, whoever calls
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._consecutive_failures = 0
        self.failures = 0  # every failed run_once, a metric
        self.signals = ServiceSignals()

    # -- the work ----------------------------------------------------------------------------

    def _run(self) -> T:
        raise NotImplementedError

    def run_once(self) -> T | None:
        """Do the work once now and return what it did; None if another thread of this worker
        is doing it at this moment. Raises what the work raises (after counting it)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._last_run = self._clock()
            try:
                result = self._run()
            except Exception:
                self.failures += 1
                self._consecutive_failures += 1
                self.signals.failed.emit()
                raise
            self._consecutive_failures = 0
        finally:
            self._lock.release()
        self.signals.ran.emit()
        return result

    def due(self) -> bool:
        return self._clock() - self._last_run >= self._current_interval()

    def run_if_due(self) -> bool:
        """``run_once()`` if the interval has passed since the last run. True if it ran."""
        if not self.due():
            return False
        self.run_once()
        return True

    def mark_ran(self) -> None:
        """Count the work as done now (the worker's registration is its first heartbeat)."""
        self._last_run = self._clock()

    def _current_interval(self) -> float:
        """The interval; while the work keeps failing, a backoff of 1, 2, 4... seconds up to
        ``max_backoff`` when that is longer (a scan every second does not retry every second
        while the database is away; a heartbeat is never retried later than its interval)."""
        if self._consecutive_failures == 0:
            return self.interval
        backoff = min(2.0 ** (self._consecutive_failures - 1), self._max_backoff)
        return max(self.interval, backoff)

    # -- the timer ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run the service on a thread of its own until ``stop()``. Idempotent."""
        if self.alive:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Whether ``start()`` was called and ``stop()`` was not since."""
        return self._thread is not None and not self._stopping.is_set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.run_if_due()
            except PoolClosed:
                # The worker is closing: its pool is gone, and so is the need for this service.
                self._stopping.set()
                return
            except Exception as exc:
                if isinstance(exc, psycopg.OperationalError | PoolTimeout):
                    log.warning("%s failed: %s", self.name, first_line(exc))
                else:
                    log.exception("%s failed", self.name)
            self._stopping.wait(max(self._last_run + self._current_interval() - self._clock(), 0))
