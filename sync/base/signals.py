"""Signals a long-lived part of the engine emits when it has done something (a service ran, a
connection was lost, a batch was written), so a test waits for the event instead of sleeping."""

from __future__ import annotations

import threading


class TestSignal:
    """Counts emissions; a test waits for the next one, or for a total, instead of sleeping."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    @property
    def count(self) -> int:
        with self._cond:
            return self._count

    def emit(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> bool:
        """Until ``count`` emissions in all have happened; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= count, timeout)
