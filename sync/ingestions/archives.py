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
from datetime import datetime

from sync.base.abort import AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.documents import DocumentLimits, Embedder, expand_zip
from sync.ingestions.job import indexed_with
from sync.ingestions.models import IngestionStatus
from sync.ingestions.rows import ClaimedIngestion, Member
from sync.ingestions.sources import Source, SourceGone, member_name
from sync.ingestions.store import IngestionStore
from sync.jobs.log import Logger
from sync.vocabulary import ErrorKind, JobError

log = logging.getLogger("sync.ingestions")


class ArchiveJob:
    def __init__(
        self,
        *,
        store: IngestionStore,
        settings: Settings,
        secrets: SecretBox | None,
        embedder: Embedder,
        limits: DocumentLimits,
    ) -> None:
        self._store = store
        self._settings = settings
        self._secrets = secrets
        self.embedder = embedder
        self.limits = limits

    def work(self, job: ClaimedIngestion, abort: AbortSignal, logger: Logger) -> str:
        """One attempt of a claimed expansion, to its end: ``ready``, ``cancelled`` (a cancel
        came meanwhile) or ``lost`` (another worker took it over), each written here, guarded
        by its ``processing_since``. What ended it early is raised, for the kind's decision."""
        source = Source(
            job,
            store=self._store,
            secrets=self._secrets,
            limits=self.limits,
            stopper=abort,
            max_inline_wait=self._settings.max_inline_wait,
            logger=logger,
            lease=None,
        )
        assert job.processing_since is not None  # stamped by the expansion's claim
        return self._expand(job, job.processing_since, source, abort, logger)

    def _expand(
        self,
        job: ClaimedIngestion,
        since: datetime,
        source: Source,
        stopper: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        info = source.describe()
        if info is None:
            raise SourceGone("the record is no longer a file")
        members: list[Member] = []
        expanded = 0
        with source.bytes_of_file() as spooled:
            for member in expand_zip(spooled.path, self.limits, name=info.name):
                stopper.check()
                members.append(Member(member.path, member.content.sha256, member_name(member.path)))
                expanded += member.size
            sha256 = spooled.sha256
        expansion = self._store.expand_archive(
            job.id,
            since,
            members=members,
            name=info.name,
            scope=info.scope,
            archive_sha256=sha256,
            indexed_with=indexed_with(self.embedder, self.limits),
            results={"members": len(members), "expanded_bytes": expanded},
        )
        if expansion.finished:
            logger.info(
                "%s expanded: %d member(s), %d queued for ingestion",
                info.name,
                len(members),
                expansion.queued,
            )
            return "ready"
        # Not ours any more (reclaimed after processing_since), or cancelled meanwhile.
        if self._store.end_archive(
            job.id,
            since,
            IngestionStatus.CANCELLED,
            error=JobError(ErrorKind.CANCELLED, "a cancel was requested"),
        ):
            return "cancelled"
        logger.warning("the expansion was taken over by another worker; it writes nothing")
        return "lost"
