"""The one abort signal of a run. The run timeout, a lost lease, a cancel request and a graceful
shutdown all trip it; the connector (through its context), the HTTP client and the record
writer all listen to it."""

from __future__ import annotations

import threading
from enum import StrEnum

from connectors.errors import Aborted


class AbortReason(StrEnum):
    """Why a run (or any leased job) was stopped before it ended by itself."""

    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


# When two reasons race, the stronger one is kept: a lost lease forbids any further write, and
# a cancel request outranks a shutdown (the user asked for the run to end, not to come back).
_STRENGTH = {
    AbortReason.TIMEOUT: 0,
    AbortReason.SHUTDOWN: 1,
    AbortReason.CANCELLED: 2,
    AbortReason.LEASE_LOST: 3,
}


class AbortSignal:
    """Tripped once, with the strongest reason given. Its event is made by the first
    :meth:`wait`: most signals (a short job's) are only ever read, and an event costs more to
    make than the rest of the signal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event: threading.Event | None = None
        self._reason: AbortReason | None = None

    def trip(self, reason: AbortReason) -> None:
        with self._lock:
            if self._reason is None or _STRENGTH[reason] > _STRENGTH[self._reason]:
                self._reason = reason
            event = self._event
        if event is not None:
            event.set()

    @property
    def reason(self) -> AbortReason | None:
        return self._reason

    @property
    def is_set(self) -> bool:
        return self._reason is not None

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if the signal tripped meanwhile."""
        with self._lock:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(max(seconds, 0))

    def check(self) -> None:
        """Raise :class:`Aborted` if the signal has tripped."""
        if self._reason is not None:
            raise Aborted(str(self._reason))
