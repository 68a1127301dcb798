"""The worker's heartbeat: every ``heartbeat_interval`` it says in ``workers`` that it is alive,
which run it executes and which providers it runs (declared ones are added while it runs). No
row back means another process took the worker id over while this one was silent (frozen, cut
off): then this one must stop."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence

from sync.base.settings import Settings
from sync.jobs.service import Service, Ticks
from sync.store import RunStore
from sync.store.db import Pool

log = logging.getLogger("sync.worker")


class Heartbeat(Service[bool]):
    """``run_once()`` is True when the beat was recorded, False when the id was taken over
    (``on_taken_over`` has been called)."""

    name = "heartbeat"

    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        *,
        worker_id: str,
        incarnation: uuid.UUID,
        version: str,
        providers: Callable[[], Sequence[str]],
        current_run: Callable[[], int | None],
        on_taken_over: Callable[[], None],
        clock: Ticks = time.monotonic,
    ) -> None:
        super().__init__(settings.heartbeat_interval, settings.max_backoff, clock=clock)
        self._store = RunStore(pool)
        self._worker_id = worker_id
        self._incarnation = incarnation
        self._version = version
        self._providers = providers
        self._current_run = current_run
        self._on_taken_over = on_taken_over

    def _run(self) -> bool:
        beat = self._store.heartbeat(
            worker_id=self._worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=self._version,
            providers=list(self._providers()),
            incarnation=self._incarnation,
            current_run_id=self._current_run(),
        )
        if not beat:
            log.error(
                "worker id %s was taken over by another process while this one was silent; "
                "stopping",
                self._worker_id,
            )
            self._on_taken_over()
            return False
        return True
