"""The statements of the workers' maintenance (``sql/maintenance.sql``) as typed functions: the
durable marker of periodic tasks and one bounded batch of each kind of retention.

Each function is one statement on the connection it is given, with typed parameters and a
typed row back; on the pool's autocommit connections each batch is its own short transaction.
With ``delete=False`` a batch deletes nothing and counts what it would delete, and ``limit=None``
counts every candidate at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from sync.store.queries import NamedQueries

MAINTENANCE = NamedQueries("maintenance.sql")

Connection = psycopg.Connection[Any]

# Before every run: where a pass of prune_runs starts.
_START = datetime(1, 1, 1, tzinfo=UTC)


def _one(conn: Connection, query: Any, params: dict[str, Any]) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchone()


# -- the durable marker -------------------------------------------------------------------------


def claim_task(conn: Connection, task: str, *, every: timedelta, worker_id: str) -> datetime | None:
    """Take ``task`` unless a worker took it within ``every``: the claim's time (pass it to
    :func:`finish_task`), or None when another worker has it for this interval."""
    row = _one(
        conn,
        MAINTENANCE.claim_maintenance,
        {"task": task, "every": every, "worker_id": worker_id},
    )
    return None if row is None else row["last_run_at"]


def finish_task(
    conn: Connection, task: str, *, claimed_at: datetime, result: dict[str, int]
) -> bool:
    """Record what the pass claimed at ``claimed_at`` did; False if a later claim replaced it."""
    with conn.cursor() as cur:
        cur.execute(
            MAINTENANCE.finish_maintenance,
            {"task": task, "claimed_at": claimed_at, "result": Jsonb(result)},
        )
        return cur.rowcount == 1


# -- retention batches --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPosition:
    """Where a pass over finished runs has got to, in (finished_at, id) order."""

    finished_at: datetime = _START
    id: int = 0


@dataclass(frozen=True)
class RunsBatch:
    walked: int  # finished runs read by this batch
    runs: int  # deleted (or, without delete, deletable)
    attempts: int  # the attempts of those runs
    next: RunPosition | None  # None: the pass has walked every run it covers


@dataclass(frozen=True)
class Batch:
    found: int  # candidates this batch met
    deleted: int


def prune_runs(
    conn: Connection,
    *,
    older_than: timedelta,
    keep: int,
    limit: int,
    after: RunPosition,
    delete: bool,
) -> RunsBatch:
    """One batch of finished runs older than ``older_than`` beyond the ``keep`` newest of their
    connection, walked after ``after``."""
    row = _one(
        conn,
        MAINTENANCE.prune_runs_batch,
        {
            "older_than": older_than,
            "keep": keep,
            "limit": limit,
            "after_finished_at": after.finished_at,
            "after_id": after.id,
            "delete": delete,
        },
    )
    assert row is not None
    walked = int(row["walked"])
    position = RunPosition(row["last_finished_at"], row["last_id"]) if walked == limit else None
    return RunsBatch(walked, int(row["runs"]), int(row["attempts"]), position)


def _batch(conn: Connection, query: Any, params: dict[str, Any]) -> Batch:
    row = _one(conn, query, params)
    assert row is not None
    return Batch(int(row["found"]), int(row["deleted"]))


def prune_workers(
    conn: Connection, *, older_than: timedelta, limit: int | None, delete: bool
) -> Batch:
    """Workers stopped, or silent without a stop, for longer than ``older_than``."""
    return _batch(
        conn,
        MAINTENANCE.prune_workers_batch,
        {"older_than": older_than, "limit": limit, "delete": delete},
    )


def prune_rate_budgets(conn: Connection, *, limit: int | None, delete: bool) -> Batch:
    """Rate budgets whose block has ended."""
    return _batch(conn, MAINTENANCE.prune_rate_budgets_batch, {"limit": limit, "delete": delete})


def prune_seen_keys(conn: Connection, *, limit: int | None, delete: bool) -> Batch:
    """Seen keys of runs that are neither queued nor running (ended, or deleted)."""
    return _batch(conn, MAINTENANCE.prune_seen_keys_batch, {"limit": limit, "delete": delete})


def prune_tombstones(
    conn: Connection, *, older_than: timedelta, limit: int | None, delete: bool
) -> Batch:
    """Records tombstoned longer than ``older_than`` ago."""
    return _batch(
        conn,
        MAINTENANCE.prune_tombstones_batch,
        {"older_than": older_than, "limit": limit, "delete": delete},
    )


def prune_http_cache(
    conn: Connection, *, older_than: timedelta, limit: int | None, delete: bool
) -> Batch:
    """ETag cache entries nobody asked for in ``older_than``."""
    return _batch(
        conn,
        MAINTENANCE.prune_http_cache_batch,
        {"older_than": older_than, "limit": limit, "delete": delete},
    )


@dataclass(frozen=True)
class JobsBatch:
    found: int  # finished jobs past their queue's retention this batch met
    deleted: int
    attempts: int  # the attempts of the jobs deleted (or, without delete, deletable)


def prune_jobs(conn: Connection, *, limit: int | None, delete: bool) -> JobsBatch:
    """Finished application jobs older than the retention of the queue they are in."""
    row = _one(conn, MAINTENANCE.prune_jobs_batch, {"limit": limit, "delete": delete})
    assert row is not None
    return JobsBatch(int(row["found"]), int(row["deleted"]), int(row["attempts"]))


def prune_ingestions(
    conn: Connection, *, older_than: timedelta, limit: int | None, delete: bool
) -> Batch:
    """Finished ingestions older than ``older_than`` (an archive waits for its members)."""
    return _batch(
        conn,
        MAINTENANCE.prune_ingestions_batch,
        {"older_than": older_than, "limit": limit, "delete": delete},
    )
