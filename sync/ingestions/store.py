"""Every statement of ingestions, by name (``sql/ingestions.sql``), behind typed functions: the
claims, the lease kind the worker's lease keeper holds ingestions with, the fenced writes of
the recipe, the archive expansion's guarded writes, and what the API reads and cancels.

None of the functions opens a transaction or commits; a caller that must make several
statements one fenced unit (a batch: its checkpoint and its chunks) wraps them in
``conn.transaction()``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from sync.base.abort import AbortReason
from sync.jobs.lease import Control, Lease, LeaseKind
from sync.store.db import Connection
from sync.store.queries import NamedQueries

log = logging.getLogger("sync.ingestions")


INGESTION_QUERIES = NamedQueries("ingestions.sql")


def _one(conn: Connection, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    row: dict[str, Any] | None = conn.execute(INGESTION_QUERIES[name], params).fetchone()
    return row


def _lease(lease: Lease) -> dict[str, Any]:
    return {"ingestion_id": lease.id, "lease_owner": lease.owner}


# -- the lease kind ----------------------------------------------------------------------------


def renew(conn: Connection, lease: Lease, length: timedelta) -> bool:
    """Extend an ingestion's lease; False means it is lost."""
    return _one(conn, "renew_ingestion_lease", {**_lease(lease), "lease": length}) is not None


def read_control(conn: Connection, lease: Lease) -> Control:
    row = _one(conn, "read_ingestion_control", _lease(lease))
    if row is None:
        return Control(AbortReason.LEASE_LOST)
    stop = AbortReason.CANCELLED if row["cancel_requested"] else None
    return Control(stop)


INGESTIONS = LeaseKind("ingestion", renew=renew, control=read_control)


# -- queueing ----------------------------------------------------------------------------------


def queue_local_ingestion(
    conn: Connection,
    *,
    workspace_id: int,
    path: str,
    name: str,
    scope: str,
    sha256: str,
    max_attempts: int,
) -> dict[str, Any] | None:
    """A queued ingestion of a local file (or the one already pending for that path); None if
    the workspace does not exist or is deleted."""
    return _one(
        conn,
        "queue_local_ingestion",
        {
            "workspace_id": workspace_id,
            "path": path,
            "name": name,
            "scope": scope,
            "source_hash": bytes.fromhex(sha256),
            "max_attempts": max_attempts,
        },
    )


# -- claims ------------------------------------------------------------------------------------


def claim_document(
    conn: Connection, worker_id: str, lease: timedelta, providers: Sequence[str] | None
) -> dict[str, Any] | None:
    return _one(
        conn,
        "claim_ingestion",
        {
            "worker_id": worker_id,
            "lease": lease,
            "providers": list(providers) if providers is not None else None,
        },
    )


def claim_archive(
    conn: Connection, worker_id: str, reclaim_after: timedelta, providers: Sequence[str] | None
) -> dict[str, Any] | None:
    return _one(
        conn,
        "claim_archive",
        {
            "worker_id": worker_id,
            "reclaim_after": reclaim_after,
            "providers": list(providers) if providers is not None else None,
        },
    )


# -- reads of the recipe -----------------------------------------------------------------------


def file_record(
    conn: Connection, connection_id: int, table_name: str, external_id: str
) -> dict[str, Any] | None:
    return _one(
        conn,
        "file_record",
        {"connection_id": connection_id, "table_name": table_name, "external_id": external_id},
    )


def document_of(conn: Connection, job: dict[str, Any]) -> dict[str, Any] | None:
    """The document the ingestion's file is indexed into, if it has one yet."""
    return _one(
        conn,
        "document_of_source",
        {k: job[k] for k in ("connection_id", "table_name", "external_id", "workspace_id")}
        | {"local_path": job["local_path"], "member_path": job["member_path"]},
    )


# -- fenced writes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Begun:
    document_id: int
    processed_units: int  # where this attempt starts


def begin(
    conn: Connection,
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
    """The attempt's first write: the document (made if need be) marked indexing, the file's
    bytes, the settings it is indexed with and its chunk count recorded. None: the lease is
    lost."""
    row = _one(
        conn,
        "begin_ingestion",
        {
            **_lease(lease),
            "name": name,
            "media_type": media_type,
            "scope": scope,
            "content_sha256": content_sha256,
            "indexed_with": indexed_with,
            "total_units": total_units,
            "results": Jsonb(results),
        },
    )
    if row is None:
        return None
    return Begun(int(row["document_id"]), int(row["processed_units"]))


def record_batch(
    conn: Connection, lease: Lease, processed_units: int, length: timedelta
) -> bool | None:
    """A batch's fence and checkpoint, first in its transaction; it renews the lease to
    ``length`` from now too. None: the lease is lost; True: a cancel was asked for (roll the
    batch back and stop); False: write the batch."""
    row = _one(
        conn,
        "record_ingestion_batch",
        {**_lease(lease), "processed_units": processed_units, "lease": length},
    )
    if row is None:
        return None
    return bool(row["cancel_requested"])


def fence(conn: Connection, lease: Lease) -> bool:
    """Lock the ingestion for a fenced write later in the transaction; False: lease lost."""
    return _one(conn, "fence_ingestion", _lease(lease)) is not None


@dataclass(frozen=True)
class Finished:
    fenced: bool  # False: the lease is lost
    finished: bool  # False (fenced): the file changed or moved meanwhile; nothing marked ready


def finish(
    conn: Connection,
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
) -> Finished:
    row = _one(
        conn,
        "finish_ingestion",
        {
            **_lease(lease),
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
        },
    )
    assert row is not None
    return Finished(bool(row["fenced"]), bool(row["finished"]))


def end(
    conn: Connection,
    lease: Lease,
    status: str,
    *,
    error: dict[str, Any] | None = None,
    results: dict[str, Any] | None = None,
) -> bool:
    """End the ingestion skipped, failed or cancelled; False: the lease is lost."""
    params = {
        **_lease(lease),
        "status": status,
        "error": Jsonb(error) if error else None,
        "results": Jsonb(results or {}),
    }
    return _one(conn, "end_ingestion", params) is not None


def requeue(
    conn: Connection,
    lease: Lease,
    delay_seconds: float,
    error: dict[str, Any],
    *,
    spend_attempt: bool = True,
) -> str | None:
    """Back to the queue after ``delay_seconds`` (or cancelled, if a cancel came meanwhile);
    the status it ended in, None if the lease is lost."""
    row = _one(
        conn,
        "requeue_ingestion",
        {
            **_lease(lease),
            "delay_seconds": delay_seconds,
            "error": Jsonb(error),
            "spend_attempt": spend_attempt,
        },
    )
    return row["status"] if row else None


def hand_back(conn: Connection, lease: Lease) -> bool:
    return _one(conn, "hand_back_ingestion", _lease(lease)) is not None


def hand_over_to_archive(conn: Connection, lease: Lease, *, name: str, scope: str | None) -> bool:
    return (
        _one(conn, "hand_over_to_archive", {**_lease(lease), "name": name, "scope": scope})
        is not None
    )


def lock_credentials(conn: Connection, lease: Lease, connection_id: int) -> dict[str, Any] | None:
    return _one(
        conn, "lock_ingestion_credentials", {**_lease(lease), "connection_id": connection_id}
    )


# -- archive expansion (guarded by processing_since) -------------------------------------------


@dataclass(frozen=True)
class Member:
    path: str
    sha256: str
    name: str


def expand_archive(
    conn: Connection,
    ingestion_id: int,
    processing_since: datetime,
    *,
    members: Sequence[Member],
    name: str,
    scope: str | None,
    archive_sha256: str,
    indexed_with: str,
    results: dict[str, Any],
) -> tuple[bool, int]:
    """Queue the members and mark the archive ready; (finished, members queued). Not finished:
    the expansion was reclaimed by another worker, or cancelled."""
    row = _one(
        conn,
        "expand_archive",
        {
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
        },
    )
    assert row is not None
    return bool(row["finished"]), int(row["queued"])


def end_archive(
    conn: Connection,
    ingestion_id: int,
    processing_since: datetime,
    status: str,
    *,
    error: dict[str, Any] | None = None,
    delay_seconds: float = 0.0,
    spend_attempt: bool = True,
    results: dict[str, Any] | None = None,
) -> bool:
    """End an expansion (``failed``, ``cancelled``) or put it back (``queued``); False: it was
    reclaimed meanwhile."""
    row = _one(
        conn,
        "end_archive",
        {
            "ingestion_id": ingestion_id,
            "processing_since": processing_since,
            "status": status,
            "error": Jsonb(error) if error else None,
            "delay_seconds": delay_seconds,
            "spend_attempt": spend_attempt,
            "results": Jsonb(results or {}),
        },
    )
    return row is not None


# -- what the API reads ------------------------------------------------------------------------


def get(conn: Connection, ingestion_id: int, workspace_id: int | None) -> dict[str, Any] | None:
    return _one(conn, "get_ingestion", {"ingestion_id": ingestion_id, "workspace_id": workspace_id})


def listing(
    conn: Connection,
    *,
    workspace_id: int | None,
    status: str | None,
    archive_id: int | None,
    limit: int,
) -> list[dict[str, Any]]:
    params = {
        "workspace_id": workspace_id,
        "status": status,
        "archive_id": archive_id,
        "limit": limit,
    }
    return conn.execute(INGESTION_QUERIES.list_ingestions, params).fetchall()


def cancel(conn: Connection, ingestion_id: int, workspace_id: int | None) -> dict[str, Any] | None:
    return _one(
        conn, "cancel_ingestion", {"ingestion_id": ingestion_id, "workspace_id": workspace_id}
    )


def documents_by_settings(conn: Connection, workspace_id: int) -> list[dict[str, Any]]:
    """The workspace's ready documents with chunks, counted by what they were indexed with."""
    return conn.execute(
        INGESTION_QUERIES.documents_by_settings, {"workspace_id": workspace_id}
    ).fetchall()


def queue_reindex(conn: Connection, workspace_id: int, indexed_with: str, max_attempts: int) -> int:
    """Queue the files of the workspace indexed otherwise than ``indexed_with``; how many."""
    params = {
        "workspace_id": workspace_id,
        "indexed_with": indexed_with,
        "max_attempts": max_attempts,
    }
    return len(conn.execute(INGESTION_QUERIES.queue_reindex, params).fetchall())


def owner_of(row: dict[str, Any]) -> Lease:
    owner = row["lease_owner"]
    assert isinstance(owner, UUID)
    return Lease(int(row["id"]), owner)


def commit_asynchronously(conn: Connection) -> None:
    """For the rest of this transaction: see "Durability" in docs/architecture.md."""
    conn.execute(INGESTION_QUERIES.commit_asynchronously)
