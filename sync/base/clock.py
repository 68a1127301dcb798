"""The one clock the engine's decisions are taken at (a run's waits and backoff, a queue's due
times). Production reads the system clock; tests drive a :class:`ManualClock` with
``advance(seconds)`` instead of sleeping."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to; safe to read and move from any thread."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2030, 1, 1, tzinfo=UTC)
        if start.tzinfo is None:
            raise ValueError("a ManualClock starts at a timezone-aware time")
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` (never back) and return the new time."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def advance_to(self, moment: datetime) -> datetime:
        """Move forward to ``moment``, if it is later than now, and return the new time."""
        with self._lock:
            self._now = max(self._now, moment)
            return self._now
