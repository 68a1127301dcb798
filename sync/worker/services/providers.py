"""The declared providers' loader: every ``providers_interval`` it loads the provider files added
to the database since (and forgets removed ones), so the worker claims and runs their syncs
without a restart; the heartbeat then tells the fleet which providers this worker runs."""

from __future__ import annotations

import logging
import time

from sync.base.settings import Settings
from sync.jobs.declared import DeclaredProviders
from sync.jobs.service import Service, Ticks
from sync.store.db import Pool

log = logging.getLogger("sync.worker")


class ProviderLoader(Service[list[str]]):
    """``run_once()`` returns the declared providers loaded now; ``names`` holds them."""

    name = "providers"

    def __init__(self, pool: Pool, settings: Settings, *, clock: Ticks = time.monotonic) -> None:
        super().__init__(settings.providers_interval, settings.max_backoff, clock=clock)
        self._declared = DeclaredProviders(pool)
        self.names: list[str] = []

    def _run(self) -> list[str]:
        names = self._declared.refresh()
        if names != self.names:
            log.info("declared providers: %s", ", ".join(names) or "none")
        self.names = names
        return names
