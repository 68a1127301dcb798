"""An attempt running in this process, as the Postgres implementation's claim starts it, and
what its handler gets as its ``abort``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from sync.base.abort import AbortSignal
from sync.queues.declarations import QueueSpec
from sync.queues.models import Job
from sync.queues.registry import Registration


class AttemptHandle:
    """What a handler gets as its ``abort``: the attempt's abort signal (tripped by a cancel,
    a lost lease, the attempt's expiry or a shutdown) and its fenced progress report."""

    def __init__(self, signal: AbortSignal, report: Callable[[int, int | None], bool]) -> None:
        self.signal = signal
        self._report = report

    @property
    def is_set(self) -> bool:
        return self.signal.is_set

    def wait(self, seconds: float) -> bool:
        return self.signal.wait(seconds)

    def report_progress(self, processed: int, total: int | None = None) -> bool:
        return self._report(processed, total)


@dataclass(frozen=True)
class RunningJob:
    """An attempt a claim started in this process."""

    job: Job
    lease_owner: UUID
    spec: QueueSpec
    registration: Registration
    signal: AbortSignal
