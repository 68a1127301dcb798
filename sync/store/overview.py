"""The statements of what operators look at, as typed methods: the workers, the queued syncs
no live worker can take, the connections with their current and last runs, and the figures
``/metrics`` exports. All read-only; each is one named statement of ``sql/queries.sql``,
repeated after a transient failure through the one :class:`~sync.store.retry.RetryPolicy`."""

from __future__ import annotations

from sync.models import WorkerInfo
from sync.overview import ConnectionOverview, MetricsSnapshot
from sync.store.db import Connection
from sync.store.pooled import PooledStore
from sync.store.queries import QUERIES
from sync.store.rows import UnservedProvider


class OverviewStore(PooledStore):
    """Operators' reads over a pool. ``workspace_id`` None: every workspace."""

    def workers(self) -> list[WorkerInfo]:
        """Every worker the database knows of, oldest first."""
        return self._on_pool(
            lambda c: [WorkerInfo.from_row(r) for r in c.execute(QUERIES.list_workers).fetchall()]
        )

    def unserved(self, stale_seconds: float, workspace_id: int | None) -> list[UnservedProvider]:
        """Queued syncs, by provider, that no worker alive within ``stale_seconds`` can run."""
        params = {"stale_seconds": stale_seconds, "workspace_id": workspace_id}
        return self._on_pool(
            lambda c: [
                UnservedProvider(r["provider"], r["runs"], r["oldest_run"])
                for r in c.execute(QUERIES.queued_runs_without_worker, params).fetchall()
            ]
        )

    def connections_overview(
        self, workspace_id: int | None, *, limit: int
    ) -> list[ConnectionOverview]:
        params = {"workspace_id": workspace_id, "limit": limit}
        return self._on_pool(
            lambda c: [
                ConnectionOverview.from_row(r)
                for r in c.execute(QUERIES.connections_overview, params).fetchall()
            ]
        )

    def metrics_snapshot(
        self, *, window_seconds: float, stale_after_seconds: float, timeout: float
    ) -> MetricsSnapshot:
        """The ``/metrics`` figures, in one statement (one snapshot) that may take at most
        ``timeout`` seconds."""
        params = {"window_seconds": window_seconds, "stale_after_seconds": stale_after_seconds}

        def call(conn: Connection) -> MetricsSnapshot:
            conn.execute(QUERIES.metrics_statement_timeout, {"timeout": f"{int(timeout * 1000)}"})
            row = conn.execute(QUERIES.metrics_snapshot, params).fetchone()
            assert row is not None  # a SELECT of aggregates without FROM: always one row
            return MetricsSnapshot.from_row(row, window_seconds)

        return self._in_transaction(call)
