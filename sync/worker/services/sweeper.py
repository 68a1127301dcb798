"""The seen-key sweeper: every ``sweep_interval``, one worker of the fleet deletes the seen keys
that runs whose worker died left behind (a worker clears its own run's keys when the run ends),
in batches of ``sweep_batch``."""

from __future__ import annotations

import logging
import time

from sync.base.settings import Settings
from sync.jobs.service import Ticks
from sync.store.db import Pool
from sync.worker.services.fleet_task import FleetTask

log = logging.getLogger("sync.worker")


class SeenKeySweeper(FleetTask):
    name = "sweeper"
    task = "sweep_seen_keys"

    def __init__(
        self, pool: Pool, settings: Settings, *, worker_id: str, clock: Ticks = time.monotonic
    ) -> None:
        super().__init__(
            pool, settings.sweep_interval, settings.max_backoff, worker_id=worker_id, clock=clock
        )
        self._batch = settings.sweep_batch

    def _pass(self) -> dict[str, int]:
        deleted = 0
        while not self._stopping.is_set():
            batch = self._store.prune_seen_keys(limit=self._batch, delete=True)
            deleted += batch.deleted
            if batch.found < self._batch:
                break
        if deleted:
            log.info("swept %d seen key(s) of ended runs", deleted)
        return {"seen_keys": deleted}
