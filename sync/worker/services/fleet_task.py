"""A periodic task that one worker of the fleet runs per interval, whatever the number of
workers: before each pass a worker takes the task's durable marker in ``maintenance_runs``
(``claim_maintenance``), and while the interval has not passed since the last worker took it,
the others skip it. The marker survives restarts, so a fleet that restarts often still runs the
task once per interval, not once per start."""

from __future__ import annotations

import time
from datetime import timedelta

from sync.jobs.service import Service, Ticks
from sync.store.db import Pool
from sync.store.maintenance import MaintenanceStore


class FleetTask(Service[dict[str, int] | None]):
    """``run_once()`` returns what the pass deleted, per kind of row, or None when another
    worker has the task for this interval. Subclasses set ``task`` and implement ``_pass()``."""

    task = "task"

    def __init__(
        self,
        pool: Pool,
        interval: float,
        max_backoff: float,
        *,
        worker_id: str,
        clock: Ticks = time.monotonic,
    ) -> None:
        super().__init__(interval, max_backoff, clock=clock)
        self._store = MaintenanceStore(pool)
        self._worker_id = worker_id

    def _pass(self) -> dict[str, int]:
        raise NotImplementedError

    def _run(self) -> dict[str, int] | None:
        every = timedelta(seconds=self.interval)
        claimed = self._store.claim_task(self.task, every=every, worker_id=self._worker_id)
        if claimed is None:
            return None
        result = self._pass()
        self._store.finish_task(self.task, claimed_at=claimed, result=result)
        return result
