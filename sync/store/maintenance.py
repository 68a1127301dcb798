"""The statements of the workers' maintenance (``sql/maintenance.sql``) as typed methods: the
durable marker of periodic tasks and one bounded batch of each kind of retention.

Each method is one statement on a connection borrowed from the pool, with typed parameters and a
typed row back; each batch is its own short transaction, repeated after a transient failure
through the one :class:`~sync.store.retry.RetryPolicy` (a lost connection only for the record of
a pass's end, which writes the same again). With ``delete=False`` a batch deletes nothing and
counts what it would delete, and ``limit=None`` counts every candidate at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from sync.store.pooled import PooledStore
from sync.store.queries import NamedQueries

MAINTENANCE = NamedQueries("maintenance.sql")

# Before every run: where a pass of prune_runs starts.
_START = datetime(1, 1, 1, tzinfo=UTC)


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


@dataclass(frozen=True)
class JobsBatch:
    found: int  # finished jobs past their queue's retention this batch met
    deleted: int
    attempts: int  # the attempts of the jobs deleted (or, without delete, deletable)


class MaintenanceStore(PooledStore):
    """The maintenance statements over a pool."""

    # -- the durable marker ----------------------------------------------------------------

    def claim_task(self, task: str, *, every: timedelta, worker_id: str) -> datetime | None:
        """Take ``task`` unless a worker took it within ``every``: the claim's time (pass it to
        :meth:`finish_task`), or None when another worker has it for this interval."""
        params = {"task": task, "every": every, "worker_id": worker_id}
        row = self._one(MAINTENANCE.claim_maintenance, params)
        return None if row is None else row["last_run_at"]

    def finish_task(self, task: str, *, claimed_at: datetime, result: dict[str, int]) -> bool:
        """Record what the pass claimed at ``claimed_at`` did; False if a later claim replaced
        it."""
        params = {"task": task, "claimed_at": claimed_at, "result": Jsonb(result)}
        return self._on_pool(
            lambda c: c.execute(MAINTENANCE.finish_maintenance, params).rowcount == 1,
            idempotent=True,
        )

    # -- retention batches -----------------------------------------------------------------

    def prune_runs(
        self, *, older_than: timedelta, keep: int, limit: int, after: RunPosition, delete: bool
    ) -> RunsBatch:
        """One batch of finished runs older than ``older_than`` beyond the ``keep`` newest of
        their connection, walked after ``after``."""
        params = {
            "older_than": older_than,
            "keep": keep,
            "limit": limit,
            "after_finished_at": after.finished_at,
            "after_id": after.id,
            "delete": delete,
        }
        row = self._one(MAINTENANCE.prune_runs_batch, params)
        assert row is not None
        walked = int(row["walked"])
        position = RunPosition(row["last_finished_at"], row["last_id"]) if walked == limit else None
        return RunsBatch(walked, int(row["runs"]), int(row["attempts"]), position)

    def _batch(self, query: Any, params: dict[str, Any]) -> Batch:
        row = self._one(query, params)
        assert row is not None
        return Batch(int(row["found"]), int(row["deleted"]))

    def prune_workers(self, *, older_than: timedelta, limit: int | None, delete: bool) -> Batch:
        """Workers stopped, or silent without a stop, for longer than ``older_than``."""
        params = {"older_than": older_than, "limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_workers_batch, params)

    def prune_rate_budgets(self, *, limit: int | None, delete: bool) -> Batch:
        """Rate budgets whose block has ended."""
        params = {"limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_rate_budgets_batch, params)

    def prune_seen_keys(self, *, limit: int | None, delete: bool) -> Batch:
        """Seen keys of runs that are neither queued nor running (ended, or deleted)."""
        params = {"limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_seen_keys_batch, params)

    def prune_tombstones(self, *, older_than: timedelta, limit: int | None, delete: bool) -> Batch:
        """Records tombstoned longer than ``older_than`` ago."""
        params = {"older_than": older_than, "limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_tombstones_batch, params)

    def prune_http_cache(self, *, older_than: timedelta, limit: int | None, delete: bool) -> Batch:
        """ETag cache entries nobody asked for in ``older_than``."""
        params = {"older_than": older_than, "limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_http_cache_batch, params)

    def prune_jobs(self, *, limit: int | None, delete: bool) -> JobsBatch:
        """Finished application jobs older than the retention of the queue they are in."""
        row = self._one(MAINTENANCE.prune_jobs_batch, {"limit": limit, "delete": delete})
        assert row is not None
        return JobsBatch(int(row["found"]), int(row["deleted"]), int(row["attempts"]))

    def prune_ingestions(self, *, older_than: timedelta, limit: int | None, delete: bool) -> Batch:
        """Finished ingestions older than ``older_than`` (an archive waits for its members)."""
        params = {"older_than": older_than, "limit": limit, "delete": delete}
        return self._batch(MAINTENANCE.prune_ingestions_batch, params)
