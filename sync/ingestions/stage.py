"""The worker's ingestion stage: each poll claims and executes at most one archive expansion
and at most one document ingestion. The document ingestion is held by the worker's lease
keeper, like a run; its abort signal trips when its lease is lost, when it is cancelled and
when the worker stops (it is then handed back without spending an attempt).

While the worker is executing runs back to back, the stage looks for ingestions at most once a
second (two claims are two round trips, which a queue of short runs would otherwise pay per
run); an idle poll always looks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.documents import DocumentLimits, Embedder
from sync.documents.embedders import close_embedder, embedder_from
from sync.ingestions import store
from sync.ingestions.archives import ArchiveJob
from sync.ingestions.context import EndpointContext
from sync.ingestions.job import DocumentJob
from sync.jobs.lease import LeaseKeeper
from sync.store.db import Pool

log = logging.getLogger("sync.ingestions")

LOOK_EVERY_WHILE_BUSY = 1.0  # seconds between looks while the worker executes runs


class IngestionStage:
    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        secrets: SecretBox | None,
        keeper: LeaseKeeper,
        worker_id: str,
        providers: Sequence[str],
        *,
        stopping: Callable[[], bool],
        runs_executed: Callable[[], int] = lambda: 0,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._secrets = secrets
        self._keeper = keeper
        self._worker_id = worker_id
        self._providers = list(providers)
        self._stopping = stopping
        self._runs_executed = runs_executed
        self._runs_seen = runs_executed()
        self._last_look = float("-inf")
        # The embedder of new chunks (CONNECTOR_SYNC_EMBEDDER), whose requests serve the attempt
        # running, and the caps and chunk settings (CONNECTOR_SYNC_DOCUMENTS_*).
        self.endpoint = EndpointContext(settings.max_inline_wait)
        self.embedder: Embedder = embedder_from(settings, self.endpoint)
        self.limits = DocumentLimits()
        log.info("ingestions embed with %s", self.embedder.model)
        self.executed = 0  # ingestions and expansions this stage ran

    def poll(self) -> bool:
        """True if it executed something (more may be waiting)."""
        done = False
        if self._stopping():
            return False
        runs, self._runs_seen = self._runs_seen, self._runs_executed()
        now = time.monotonic()
        if runs != self._runs_seen and now - self._last_look < LOOK_EVERY_WHILE_BUSY:
            return False
        self._last_look = now
        with self._pool.connection() as conn:
            archive = store.claim_archive(
                conn,
                self._worker_id,
                timedelta(seconds=self._settings.archive_reclaim_seconds),
                self._providers,
            )
        if archive is not None:
            self._archives().run(archive)
            self.executed += 1
            done = True
        if self._stopping():
            return done
        with self._pool.connection() as conn:
            document = store.claim_document(
                conn,
                self._worker_id,
                timedelta(seconds=self._settings.lease_seconds),
                self._providers,
            )
        if document is not None:
            self._documents().run(document)
            self.executed += 1
            done = True
        return done

    def close(self) -> None:
        close_embedder(self.embedder)

    def _documents(self) -> DocumentJob:
        return DocumentJob(
            pool=self._pool,
            settings=self._settings,
            secrets=self._secrets,
            keeper=self._keeper,
            worker_id=self._worker_id,
            embedder=self.embedder,
            endpoint=self.endpoint,
            limits=self.limits,
            stopping=self._stopping,
        )

    def _archives(self) -> ArchiveJob:
        return ArchiveJob(
            pool=self._pool,
            settings=self._settings,
            secrets=self._secrets,
            worker_id=self._worker_id,
            embedder=self.embedder,
            limits=self.limits,
            stopping=self._stopping,
        )
