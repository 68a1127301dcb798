"""The schedule enqueuer: every ``schedule_interval`` it queues a run of each due connection (at
most ``schedule_batch`` per scan) and moves the connection's next run on. Any number of workers
scan at once: the statement skips the connections another scan has locked."""

from __future__ import annotations

import logging
import time

from sync.base.settings import Settings
from sync.jobs.service import Service, Ticks
from sync.store import RunStore
from sync.store.db import Pool

log = logging.getLogger("sync.worker")


class ScheduleEnqueuer(Service[int]):
    """``run_once()`` returns how many runs it queued."""

    name = "schedules"

    def __init__(self, pool: Pool, settings: Settings, *, clock: Ticks = time.monotonic) -> None:
        super().__init__(settings.schedule_interval, settings.max_backoff, clock=clock)
        self._store = RunStore(pool)
        self._settings = settings

    def _run(self) -> int:
        queued = self._store.enqueue_due_schedules(
            self._settings.schedule_batch, self._settings.max_attempts
        )
        if queued:
            log.info("enqueued %d scheduled run(s)", queued)
        return queued
