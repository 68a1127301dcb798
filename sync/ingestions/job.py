"""One attempt of a document ingestion, the recipe, every write fenced by the ingestion's lease
owner:

1. describe the file (its record, through its connector); an archive is handed to the archive
   expansion; a file whose version is indexed already (moved or renamed) needs no download;
2. fetch its bytes to a temporary file, extract them page by page and count the one ordered,
   deterministic list of chunks they make: ``total_units``; start at ``processed_units`` (0 if
   these bytes are not the ones an earlier attempt worked on);
3. per batch of ``ingestion_batch_size`` (200) chunks: check control, embed, and in one
   transaction write the new ``processed_units`` (the fence, which also says whether a cancel
   came) and upsert the batch keyed by chunk index; the lease keeper renews meanwhile;
4. delete the chunks past the new tail that a longer earlier version left;
5. read the file's record again: if it moved (another scope) or changed, it is not marked
   ready under what it was; the finish marks it ready only if the record is still the one it
   read, in the same statement.
"""

from __future__ import annotations

import itertools
import logging
from datetime import timedelta
from typing import Any

from sync.base.abort import AbortReason, AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.documents import (
    DocumentLimits,
    Embedder,
    Extraction,
    MediaType,
    SpooledFile,
    chunks,
    media_type_of,
)
from sync.errors import LeaseLost
from sync.ingestions.context import EndpointContext
from sync.ingestions.models import IngestionStatus
from sync.ingestions.rows import ClaimedIngestion
from sync.ingestions.sources import FileInfo, Source, SourceGone
from sync.ingestions.store import CheckpointLost, IngestionStore
from sync.jobs.log import Logger
from sync.store.rows import Lease

log = logging.getLogger("sync.ingestions")

COUNT_CHECK_EVERY = 1000  # chunks counted between two looks at the abort signal


def indexed_with(embedder: Embedder, limits: DocumentLimits) -> str:
    """What the stored chunks depend on besides the bytes: the embedding model and the chunk
    settings. A document indexed otherwise is indexed again."""
    return f"{embedder.model}/chars={limits.chunk_chars}/overlap={limits.chunk_overlap}"


def model_of(fingerprint: str) -> str:
    """The embedding model of an :func:`indexed_with` value."""
    return fingerprint.rsplit("/chars=", 1)[0]


class DocumentJob:
    """The recipe of one attempt of a claimed document ingestion."""

    def __init__(
        self,
        *,
        store: IngestionStore,
        settings: Settings,
        secrets: SecretBox | None,
        embedder: Embedder,
        endpoint: EndpointContext,
        limits: DocumentLimits,
    ) -> None:
        self._store = store
        self._settings = settings
        self._secrets = secrets
        self.embedder = embedder
        self._endpoint = endpoint
        self.limits = limits

    def work(self, job: ClaimedIngestion, abort: AbortSignal, logger: Logger) -> str:
        """One attempt of a claimed ingestion, to its end: what became of it (``ready``,
        ``skipped``, ``archive``, or ``queued`` when the file changed while it was indexed),
        each written by the recipe, fenced by the ingestion's lease. What ended it early is
        raised, for the kind's decision."""
        lease = job.lease
        source = Source(
            job,
            store=self._store,
            secrets=self._secrets,
            limits=self.limits,
            stopper=abort,
            max_inline_wait=self._settings.max_inline_wait,
            logger=logger,
            lease=lease,
        )
        logger.info(
            "ingestion of %s started (attempt %d of %d)",
            job.name or job.local_path or job.external_id,
            job.attempts,
            job.max_attempts,
        )
        with self._endpoint.serving(abort, logger):
            return self._attempt(job, lease, source, abort, logger)

    # -- the recipe ---------------------------------------------------------------------------

    def _attempt(
        self,
        job: ClaimedIngestion,
        lease: Lease,
        source: Source,
        stopper: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        info = source.describe()
        if info is None:
            skipped = {"skipped": "the record is not a file"}
            self._store.end(lease, IngestionStatus.SKIPPED, results=skipped)
            logger.info("skipped: the record is not a file")
            return "skipped"
        if not job.member_path and info.is_archive:
            if not self._store.hand_over_to_archive(lease, name=info.name, scope=info.scope):
                raise LeaseLost()
            logger.info("%s is an archive: handed to the archive expansion", info.name)
            return "archive"
        fingerprint = indexed_with(self.embedder, self.limits)
        indexed = self._store.ready_document(job)
        if indexed is not None and indexed.indexed_with != fingerprint:
            indexed = None  # its chunks were made otherwise: nothing of them is reused
        if indexed and info.version is not None and indexed.version == info.version:
            # Only the record changed (the file moved or was renamed): its chunks stand.
            logger.info("version %s is indexed already: no download", info.version)
            return self._finish(
                job, lease, source, info, indexed.id, indexed.content_sha256, indexed.chunks,
                {"reused": True}, logger,
            )  # fmt: skip
        with source.bytes_to_index() as spooled:
            stopper.check()
            if indexed and indexed.content_sha256 == spooled.sha256:
                logger.info("these bytes are indexed already: nothing embedded")
                return self._finish(
                    job, lease, source, info, indexed.id, spooled.sha256, indexed.chunks,
                    {"reused": True}, logger,
                )  # fmt: skip
            return self._index(job, lease, source, info, spooled, stopper, logger)

    def _index(
        self,
        job: ClaimedIngestion,
        lease: Lease,
        source: Source,
        info: FileInfo,
        spooled: SpooledFile,
        stopper: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> str:
        with spooled.path.open("rb") as probe:
            head = probe.read(8)
        media = media_type_of(info.name, info.media_type, head)
        # The first pass counts the chunks (and meets every cap before anything is written).
        counted = Extraction(spooled.path, media, self.limits, name=info.name)
        total = 0
        for total, _ in enumerate(chunks(counted, self.limits, name=info.name), start=1):
            if total % COUNT_CHECK_EVERY == 0:
                stopper.check()
        pages = {"pages": counted.pages, "skipped_pages": counted.skipped_pages}
        begun = self._store.begin(
            lease,
            name=info.name,
            media_type=media.value,
            scope=info.scope,
            content_sha256=spooled.sha256,
            indexed_with=indexed_with(self.embedder, self.limits),
            total_units=total,
            results=pages,
        )
        if begun is None:
            raise LeaseLost()
        start = begun.processed_units
        size = self._settings.ingestion_batch_size
        # Which bytes the chunks come from: a later attempt resumes only on the same ones.
        logger.info(
            "%d chunk(s) of bytes sha256:%s, embedding from chunk %d",
            total,
            spooled.sha256[:16],
            start,
        )
        if start:
            logger.info(
                "resumes at chunk %d of %d (batch %d), where an earlier attempt left it",
                start,
                total,
                start // size + 1,
            )
        self._write_batches(
            lease, begun.document_id, spooled, media, info, start, total, stopper, logger
        )
        dropped = self._store.delete_tail(lease, begun.document_id, total)
        if dropped:
            logger.info("deleted %d chunk(s) past the new end of the document", dropped)
        return self._finish(
            job, lease, source, info, begun.document_id, spooled.sha256, total,
            {**pages, "tail_deleted": dropped}, logger, written=total,
        )  # fmt: skip

    def _write_batches(
        self,
        lease: Lease,
        document_id: int,
        spooled: SpooledFile,
        media: MediaType,
        info: FileInfo,
        start: int,
        total: int,
        stopper: AbortSignal,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        extraction = Extraction(spooled.path, media, self.limits, name=info.name)
        made = itertools.islice(chunks(extraction, self.limits, name=info.name), start, None)
        size = self._settings.ingestion_batch_size
        length = timedelta(seconds=self._settings.lease_seconds)
        processed = start
        while True:
            stopper.check()  # the control read: lost, cancelled, timed out, shutting down
            batch = list(itertools.islice(made, size))
            if not batch:
                return
            vectors = self.embedder.embed([c.text for c in batch])
            logger.info("embedded chunks %d-%d of %d", batch[0].index, batch[-1].index, total)
            cancelled = self._store.write_batch(
                lease,
                document_id=document_id,
                chunks=batch,
                vectors=vectors,
                model=self.embedder.model,
                from_units=processed,
                processed_units=processed + len(batch),
                length=length,
            )
            if cancelled:  # nothing of the batch was written
                stopper.trip(AbortReason.CANCELLED)
                stopper.check()
            processed += len(batch)

    def _finish(
        self,
        job: ClaimedIngestion,
        lease: Lease,
        source: Source,
        info: FileInfo,
        document_id: int,
        sha256: str,
        total: int,
        results: dict[str, Any],
        logger: logging.LoggerAdapter[logging.Logger],
        written: int | None = None,
    ) -> str:
        """Mark the document ready under the file's scope as it is now, never as it was, and,
        when this attempt wrote its chunks (``written``: how many), never with a hole."""
        fingerprint = indexed_with(self.embedder, self.limits)
        for _ in range(3):
            current = source.describe() if not source.is_local else info
            if current is None:
                raise SourceGone("the record is no longer a file")
            if current.record_hash != info.record_hash:
                if current.version is None or current.version != info.version:
                    # The content may have changed meanwhile: the next attempt sees its bytes.
                    self._store.hand_back(lease)
                    logger.info("the file changed while it was indexed: queued again")
                    return "queued"
                if current.scope != info.scope:
                    logger.info(
                        "the file moved from %s to %s while it was indexed: ready under %s only",
                        info.scope,
                        current.scope,
                        current.scope,
                    )
            hashed = (
                current.record_hash if current.record_hash is not None else bytes.fromhex(sha256)
            )
            done = self._store.finish(
                lease,
                document_id=document_id,
                record_hash=current.record_hash,
                name=current.name,
                scope=current.scope,
                version=info.version,
                content_sha256=sha256,
                source_hash=hashed,
                indexed_with=fingerprint,
                total_units=total,
                results=results,
                written=written,
            )
            if not done.fenced:
                raise LeaseLost()
            if written is not None and done.checkpoint != written:
                raise CheckpointLost(done.checkpoint or 0, written)
            if done.finished:
                logger.info("ready: %d chunk(s) of %s under %s", total, current.name, current.scope)
                return "ready"
            info = FileInfo(
                info.name, info.scope, info.media_type, info.version, current.record_hash
            )
            # The record moved on between the read and the finish: read it again.
        self._store.hand_back(lease)
        return "queued"
