"""Every statement of ingestions (``sql/ingestions.sql``) as typed methods with typed rows: the
claims, the lease keeper's renew and control, the reads and fenced writes of the recipe, the
archive expansion's guarded writes, and what the API queues, reads and cancels.

Every method that borrows a connection from the pool repeats itself through the one
:class:`~sync.store.retry.RetryPolicy`: a transient failure always (a batch, or the delete of a
document's tail, as one transaction); a lost connection only for an end (finish, end, requeue,
hand back, hand over to the archive kind, an expansion's write and end: fenced or guarded, so a
second try of one that committed matches nothing), never for a claim. A failure of any other
statement reaches the caller, which decides for the attempt. Methods that take a connection
(``conn``) run on it: the lease keeper's own, or a transaction the caller holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from sync.documents import Chunk, DocumentStore
from sync.documents.embeddings import Vector
from sync.errors import LeaseLost
from sync.ingestions.models import Ingestion, IngestionStatus
from sync.ingestions.rows import (
    Begun,
    ClaimedIngestion,
    Expanded,
    FileRecord,
    Finished,
    IndexedDocument,
    IndexedWith,
    Member,
)
from sync.store.db import Connection
from sync.store.pooled import PooledStore
from sync.store.queries import NamedQueries
from sync.store.rows import Lease
from sync.vocabulary import JobError


class CheckpointLost(Exception):
    """The ingestion's checkpoint is short of the chunks this attempt wrote: a database crash
    lost the last batches' commits (they do not wait for the WAL flush). Nothing more is
    written; the next attempt resumes where the checkpoint is."""

    def __init__(self, checkpoint: int, written: int) -> None:
        super().__init__(
            f"the database lost the last batches (a crash): chunks {checkpoint}-{written - 1} "
            f"are to be written again, from chunk {checkpoint}"
        )
        self.checkpoint = checkpoint


INGESTION_QUERIES = NamedQueries("ingestions.sql")


def _fence(lease: Lease) -> dict[str, Any]:
    return {"ingestion_id": lease.id, "lease_owner": lease.owner}


def _error(error: JobError | None) -> Jsonb | None:
    return Jsonb(error.to_json()) if error is not None else None


def _providers(providers: Sequence[str] | None) -> list[str] | None:
    return list(providers) if providers is not None else None


class IngestionStore(PooledStore):
    """The ingestions' statements over a pool. ``workspace_id`` None in a method's parameters:
    any workspace (an engine not scoped to one)."""

    # -- the lease keeper's, on its own connection -------------------------------------------

    @staticmethod
    def renew(conn: Connection, lease: Lease, length: timedelta) -> bool:
        """Extend an ingestion's lease; False means it is lost."""
        params = {**_fence(lease), "lease": length}
        return conn.execute(INGESTION_QUERIES.renew_ingestion_lease, params).fetchone() is not None

    @staticmethod
    def control(conn: Connection, lease: Lease) -> bool | None:
        """Whether the holder must stop (a cancel, or its file's connection is gone); None: the
        lease is lost."""
        row = conn.execute(INGESTION_QUERIES.read_ingestion_control, _fence(lease)).fetchone()
        return None if row is None else bool(row["cancel_requested"])

    # -- claims ----------------------------------------------------------------------------

    def claim_document(
        self, worker_id: str, lease: timedelta, providers: Sequence[str] | None
    ) -> ClaimedIngestion | None:
        """A document ingestion, now running under a fresh lease owner; None: none is due."""
        params = {"worker_id": worker_id, "lease": lease, "providers": _providers(providers)}
        return self._claimed(INGESTION_QUERIES.claim_ingestion, params)

    def claim_archive(
        self, worker_id: str, reclaim_after: timedelta, providers: Sequence[str] | None
    ) -> ClaimedIngestion | None:
        """An archive to expand, stamped with a fresh ``processing_since``; None: none is
        due."""
        params = {
            "worker_id": worker_id,
            "reclaim_after": reclaim_after,
            "providers": _providers(providers),
        }
        return self._claimed(INGESTION_QUERIES.claim_archive, params)

    def _claimed(self, query: Any, params: dict[str, Any]) -> ClaimedIngestion | None:
        row = self._one(query, params)
        return None if row is None else ClaimedIngestion.from_row(row)

    # -- reads of the recipe ---------------------------------------------------------------

    def file_record(
        self, connection_id: int, table_name: str, external_id: str
    ) -> FileRecord | None:
        """A synced file's stored record; None: never synced, or purged."""
        params = {
            "connection_id": connection_id,
            "table_name": table_name,
            "external_id": external_id,
        }
        row = self._one(INGESTION_QUERIES.file_record, params)
        return None if row is None else FileRecord.from_row(row)

    def ready_document(self, job: ClaimedIngestion) -> IndexedDocument | None:
        """The ready document the ingestion's file is indexed into, if it has one."""
        params = {
            "connection_id": job.connection_id,
            "table_name": job.table_name,
            "external_id": job.external_id,
            "workspace_id": job.workspace_id,
            "local_path": job.local_path,
            "member_path": job.member_path,
        }
        row = self._one(INGESTION_QUERIES.document_of_source, params)
        if row is None or row["status"] != "ready":
            return None
        return IndexedDocument.from_row(row)

    # -- fenced writes ---------------------------------------------------------------------

    def begin(
        self,
        lease: Lease,
        *,
        name: str,
        media_type: str,
        scope: str | None,
        content_sha256: str,
        indexed_with: str,
        total_units: int,
        results: dict[str, Any],
    ) -> Begun | None:
        """The attempt's first write: the document (made if need be) marked indexing, the
        file's bytes, the settings it is indexed with and its chunk count recorded. None: the
        lease is lost."""
        params = {
            **_fence(lease),
            "name": name,
            "media_type": media_type,
            "scope": scope,
            "content_sha256": content_sha256,
            "indexed_with": indexed_with,
            "total_units": total_units,
            "results": Jsonb(results),
        }
        row = self._one(INGESTION_QUERIES.begin_ingestion, params)
        return None if row is None else Begun(int(row["document_id"]), int(row["processed_units"]))

    def write_batch(
        self,
        lease: Lease,
        *,
        document_id: int,
        chunks: Sequence[Chunk],
        vectors: Sequence[Vector],
        model: str,
        from_units: int,
        processed_units: int,
        length: timedelta,
    ) -> bool:
        """One batch in one transaction: its fence and checkpoint first (the new
        ``processed_units``, onto ``from_units``, and the lease renewed to ``length`` from now),
        then its chunks. True: a cancel was asked for, and nothing of the batch was written.
        Raises :class:`LeaseLost` when the lease is lost, :class:`CheckpointLost` when the
        checkpoint is not ``from_units`` (nothing written either)."""
        params = {
            **_fence(lease),
            "from_units": from_units,
            "processed_units": processed_units,
            "lease": length,
        }

        def call(conn: Connection) -> bool:
            with conn.transaction():
                # A crash may lose the last batches, never a checkpoint without its chunks (see
                # "Durability" in docs/architecture.md); a checkpoint never moves past a lost one.
                conn.execute(INGESTION_QUERIES.commit_asynchronously)
                row = conn.execute(INGESTION_QUERIES.record_ingestion_batch, params).fetchone()
                if row is None:
                    raise LeaseLost()
                if not row["advanced"]:
                    raise CheckpointLost(row["checkpoint"], from_units)
                if row["cancel_requested"]:
                    raise psycopg.Rollback()  # not a chunk more
                DocumentStore(conn).upsert_chunks(document_id, chunks, vectors, model=model)
                return False
            return True  # rolled back

        return self._on_pool(call)

    def delete_tail(self, lease: Lease, document_id: int, tail: int) -> int:
        """Delete the document's chunks from index ``tail`` on (a longer earlier version's),
        fenced; how many. Raises :class:`LeaseLost` when the lease is lost."""

        def call(conn: Connection) -> int:
            if conn.execute(INGESTION_QUERIES.fence_ingestion, _fence(lease)).fetchone() is None:
                raise LeaseLost()
            return DocumentStore(conn).delete_chunks_from(document_id, tail)

        return self._in_transaction(call)

    def finish(
        self,
        lease: Lease,
        *,
        document_id: int,
        record_hash: bytes | None,
        name: str,
        scope: str | None,
        version: str | None,
        content_sha256: str,
        source_hash: bytes,
        indexed_with: str,
        total_units: int,
        results: dict[str, Any],
        written: int | None = None,
    ) -> Finished:
        """Mark the document ready, under the scope it was indexed for only while the file's
        record is still the one described (``record_hash``), and, when this attempt wrote chunks
        (``written``: up to there), only while its checkpoint still says so."""
        params = {
            **_fence(lease),
            "written": written,
            "document_id": document_id,
            "record_hash": record_hash,
            "name": name,
            "scope": scope,
            "version": version,
            "content_sha256": content_sha256,
            "source_hash": source_hash,
            "indexed_with": indexed_with,
            "total_units": total_units,
            "results": Jsonb(results),
        }
        row = self._one(INGESTION_QUERIES.finish_ingestion, params, idempotent=True)
        assert row is not None  # a SELECT of counts: always one row
        return Finished(bool(row["fenced"]), bool(row["finished"]), row["checkpoint"])

    def end(
        self,
        lease: Lease,
        status: IngestionStatus,
        *,
        error: JobError | None = None,
        results: dict[str, Any] | None = None,
    ) -> bool:
        """End the ingestion skipped, failed or cancelled; False: the lease is lost."""
        params = {
            **_fence(lease),
            "status": status,
            "error": _error(error),
            "results": Jsonb(results or {}),
        }
        return self._one(INGESTION_QUERIES.end_ingestion, params, idempotent=True) is not None

    def requeue(
        self, lease: Lease, delay_seconds: float, error: JobError, *, spend_attempt: bool
    ) -> str | None:
        """Back to the queue after ``delay_seconds`` (or cancelled, if a cancel came
        meanwhile); the status it ended in, None if the lease is lost."""
        params = {
            **_fence(lease),
            "delay_seconds": delay_seconds,
            "error": Jsonb(error.to_json()),
            "spend_attempt": spend_attempt,
        }
        row = self._one(INGESTION_QUERIES.requeue_ingestion, params, idempotent=True)
        return None if row is None else str(row["status"])

    def hand_back(self, lease: Lease, *, closing: bool = False) -> bool:
        """Back to the queue at once without spending an attempt; False: the lease is lost.
        ``closing``: the worker is closing and does not wait for the database, so a lost
        connection is not repeated (the lease runs out)."""
        query = INGESTION_QUERIES.hand_back_ingestion
        return self._one(query, _fence(lease), idempotent=not closing) is not None

    def hand_over_to_archive(self, lease: Lease, *, name: str, scope: str | None) -> bool:
        """The file is an archive: the same row queued as an archive expansion; False: the
        lease is lost."""
        params = {**_fence(lease), "name": name, "scope": scope}
        return (
            self._one(INGESTION_QUERIES.hand_over_to_archive, params, idempotent=True) is not None
        )

    @staticmethod
    def lock_credentials(conn: Connection, lease: Lease, connection_id: int) -> bytes | None:
        """Lock the file's connection row for a credential refresh, in the caller's transaction,
        while the lease holds (raises :class:`LeaseLost` otherwise); its stored credentials."""
        params = {**_fence(lease), "connection_id": connection_id}
        row = conn.execute(INGESTION_QUERIES.lock_ingestion_credentials, params).fetchone()
        if row is None:
            raise LeaseLost()
        credentials: bytes | None = row["credentials"]
        return credentials

    # -- archive expansion (guarded by processing_since) -----------------------------------

    def expand_archive(
        self,
        ingestion_id: int,
        processing_since: datetime,
        *,
        members: Sequence[Member],
        name: str,
        scope: str | None,
        archive_sha256: str,
        indexed_with: str,
        results: dict[str, Any],
    ) -> Expanded:
        """Queue the members and mark the archive ready, guarded by ``processing_since``."""
        params = {
            "ingestion_id": ingestion_id,
            "processing_since": processing_since,
            "paths": [m.path for m in members],
            "sha256s": [m.sha256 for m in members],
            "names": [m.name for m in members],
            "name": name,
            "scope": scope,
            "archive_sha256": archive_sha256,
            "indexed_with": indexed_with,
            "members": len(members),
            "results": Jsonb(results),
        }
        row = self._one(INGESTION_QUERIES.expand_archive, params, idempotent=True)
        assert row is not None  # a SELECT of counts: always one row
        return Expanded(bool(row["finished"]), int(row["queued"]))

    def end_archive(
        self,
        ingestion_id: int,
        processing_since: datetime,
        status: IngestionStatus,
        *,
        error: JobError | None = None,
        delay_seconds: float = 0.0,
        spend_attempt: bool = True,
        closing: bool = False,
    ) -> bool:
        """End an expansion (``failed``, ``cancelled``) or put it back (``queued``); False: it
        was reclaimed meanwhile. ``closing``: as for :meth:`hand_back`."""
        params = {
            "ingestion_id": ingestion_id,
            "processing_since": processing_since,
            "status": status,
            "error": _error(error),
            "delay_seconds": delay_seconds,
            "spend_attempt": spend_attempt,
            "results": Jsonb({}),
        }
        return self._one(INGESTION_QUERIES.end_archive, params, idempotent=not closing) is not None

    # -- the API's -------------------------------------------------------------------------

    def queue_local(
        self,
        *,
        workspace_id: int,
        path: str,
        name: str,
        scope: str,
        sha256: str,
        max_attempts: int,
    ) -> Ingestion | None:
        """A queued ingestion of a local file (or the one already pending for that path); None
        if the workspace does not exist or is deleted."""
        params = {
            "workspace_id": workspace_id,
            "path": path,
            "name": name,
            "scope": scope,
            "source_hash": bytes.fromhex(sha256),
            "max_attempts": max_attempts,
        }
        return self._ingestion(INGESTION_QUERIES.queue_local_ingestion, params)

    def get(self, ingestion_id: int, workspace_id: int | None) -> Ingestion | None:
        params = {"ingestion_id": ingestion_id, "workspace_id": workspace_id}
        return self._ingestion(INGESTION_QUERIES.get_ingestion, params)

    def listing(
        self,
        *,
        workspace_id: int | None,
        status: IngestionStatus | None,
        archive_id: int | None,
        limit: int,
    ) -> list[Ingestion]:
        """Newest first; ``archive_id``: the members of that archive."""
        params = {
            "workspace_id": workspace_id,
            "status": status,
            "archive_id": archive_id,
            "limit": limit,
        }
        return [Ingestion.from_row(r) for r in self._all(INGESTION_QUERIES.list_ingestions, params)]

    def cancel(self, ingestion_id: int, workspace_id: int | None) -> Ingestion | None:
        """Cancel a queued ingestion, or ask a running one to stop; None: neither (it ended,
        or there is no such ingestion)."""
        params = {"ingestion_id": ingestion_id, "workspace_id": workspace_id}
        return self._ingestion(INGESTION_QUERIES.cancel_ingestion, params)

    def _ingestion(self, query: Any, params: dict[str, Any]) -> Ingestion | None:
        row = self._one(query, params)
        return None if row is None else Ingestion.from_row(row)

    def documents_by_settings(self, workspace_id: int) -> list[IndexedWith]:
        """The workspace's ready documents with chunks, counted by what they were indexed
        with."""
        rows = self._all(INGESTION_QUERIES.documents_by_settings, {"workspace_id": workspace_id})
        return [IndexedWith.from_row(r) for r in rows]

    def queue_reindex(self, workspace_id: int, indexed_with: str, max_attempts: int) -> int:
        """Queue the files of the workspace indexed otherwise than ``indexed_with``; how
        many."""
        params = {
            "workspace_id": workspace_id,
            "indexed_with": indexed_with,
            "max_attempts": max_attempts,
        }
        return len(self._all(INGESTION_QUERIES.queue_reindex, params))
