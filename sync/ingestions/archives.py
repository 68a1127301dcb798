"""Archive expansion, the lighter kind: a ZIP file becomes one queued ingestion per member.

It holds no lease. Its claim stamps ``processing_since``; any worker takes it again once that
is older than ``archive_reclaim_seconds`` (15 minutes), and every write it makes is guarded by
the stamp it was given, so the worker it was taken from writes nothing. That is enough because
an expansion is quick and safe to redo: it only reads the archive and queues ingestions, which
are keyed by file and member.

The whole archive is expanded (every member decompressed to a temporary file, one at a time,
hashed and deleted) before anything is queued, so a zip bomb, a path that escapes, an encrypted
member or nesting past the setting refuses the archive as a whole, with one line on its
ingestion saying why. Members whose document already holds the same bytes, indexed the same
way, are not queued again; documents of members the archive no longer holds are deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from connectors.errors import Aborted
from sync.base.abort import AbortReason, AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.documents import DocumentLimits, Embedder, expand_zip
from sync.ingestions import store
from sync.ingestions.context import JobLog, Stopper
from sync.ingestions.decisions import Next, after_failure
from sync.ingestions.job import indexed_with
from sync.ingestions.sources import Source, SourceGone, member_name
from sync.store.db import Pool, first_line

log = logging.getLogger("sync.ingestions")


class ArchiveJob:
    def __init__(
        self,
        *,
        pool: Pool,
        settings: Settings,
        secrets: SecretBox | None,
        worker_id: str,
        embedder: Embedder,
        limits: DocumentLimits,
        stopping: Callable[[], bool],
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._secrets = secrets
        self._worker_id = worker_id
        self.embedder = embedder
        self.limits = limits
        self._stopping = stopping

    def run(self, job: dict[str, Any]) -> str:
        since: datetime = job["processing_since"]
        abort = AbortSignal()
        stopper = Stopper(abort, self._stopping)
        logger = JobLog(
            log, {"archive": job["id"], "attempt": job["attempts"], "worker": self._worker_id}
        )
        source = Source(
            job,
            pool=self._pool,
            secrets=self._secrets,
            limits=self.limits,
            stopper=stopper,
            max_inline_wait=self._settings.max_inline_wait,
            logger=logger,
            lease=None,
        )
        try:
            return self._expand(job, since, source, stopper, logger)
        except Exception as exc:
            return self._after(job, since, exc, abort, logger)

    def _expand(
        self,
        job: dict[str, Any],
        since: datetime,
        source: Source,
        stopper: Stopper,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        info = source.describe()
        if info is None:
            raise SourceGone("the record is no longer a file")
        members: list[store.Member] = []
        expanded = 0
        with source.bytes_of_file() as spooled:
            for member in expand_zip(spooled.path, self.limits, name=info.name):
                stopper.check()
                members.append(
                    store.Member(member.path, member.content.sha256, member_name(member.path))
                )
                expanded += member.size
            sha256 = spooled.sha256
        with self._pool.connection() as conn:
            finished, queued = store.expand_archive(
                conn,
                job["id"],
                since,
                members=members,
                name=info.name,
                scope=info.scope,
                archive_sha256=sha256,
                indexed_with=indexed_with(self.embedder, self.limits),
                results={"members": len(members), "expanded_bytes": expanded},
            )
            if finished:
                logger.info(
                    "%s expanded: %d member(s), %d queued for ingestion",
                    info.name,
                    len(members),
                    queued,
                )
                return "ready"
            # Not ours any more (reclaimed after processing_since), or cancelled meanwhile.
            if store.end_archive(
                conn,
                job["id"],
                since,
                "cancelled",
                error={"kind": "cancelled", "message": "a cancel was requested"},
            ):
                return "cancelled"
        logger.warning("the expansion was taken over by another worker; it writes nothing")
        return "lost"

    def _after(
        self,
        job: dict[str, Any],
        since: datetime,
        exc: Exception,
        abort: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        try:
            with self._pool.connection() as conn:
                if abort.reason is AbortReason.SHUTDOWN:
                    store.end_archive(conn, job["id"], since, "queued", spend_attempt=False)
                    logger.info("handed back at shutdown")
                    return "queued"
                if isinstance(exc, SourceGone):
                    error = {"kind": "file_deleted", "message": str(exc)}
                    store.end_archive(conn, job["id"], since, "cancelled", error=error)
                    return "cancelled"
                if isinstance(exc, Aborted):
                    exc = RuntimeError("the expansion was interrupted")
                decision = after_failure(
                    exc,
                    attempts=job["attempts"],
                    max_attempts=job["max_attempts"],
                    schedule=self._settings.backoff_seconds,
                    jitter=self._settings.backoff_jitter,
                )
                if decision.error["kind"] == "internal":
                    logger.exception("archive expansion failed unexpectedly")
                if decision.next is Next.REQUEUE:
                    store.end_archive(
                        conn,
                        job["id"],
                        since,
                        "queued",
                        error=decision.error,
                        delay_seconds=decision.delay,
                        spend_attempt=decision.spend_attempt,
                    )
                    return "queued"
                store.end_archive(conn, job["id"], since, decision.next.value, error=decision.error)
                logger.warning("archive %s: %s", decision.next.value, decision.error["message"])
                return decision.next.value
        except Exception as failure:  # it is reclaimed after archive_reclaim_seconds
            logger.warning("could not record how the expansion ended: %s", first_line(failure))
            return "lost"
