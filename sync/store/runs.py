"""The statements of a run's life, from its claim to its end, as typed methods: claim, renew
and control (the lease keeper's), the fenced saves along the way, the outcomes (finish, finish
and claim the next, requeue, wait for a rate limit, hand back), a purge's batches, and the
worker's registration. Each method is one named statement of ``sql/queries.sql``; none takes or
returns a dict row.

Every method that borrows a connection from the pool repeats itself through the one
:class:`~sync.store.retry.RetryPolicy`: a transient failure always; a lost connection only for
an outcome (finish, requeue, wait, hand back: fenced, so a second try of one that committed
matches nothing), never for a claim. A failure of any other statement reaches the caller,
which decides for the attempt (a database error retries the run). Methods that take a
connection (``conn``) run on it: the lease keeper's own connection, or a transaction the caller
holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from sync.base.clock import Clock, SystemClock
from sync.errors import LeaseLost
from sync.models import Attempt, Run
from sync.store.db import Connection, Pool
from sync.store.pooled import PooledStore
from sync.store.queries import QUERIES
from sync.store.retry import DEFAULT, RetryPolicy, is_connection_lost, is_transient
from sync.store.rows import (
    ClaimedRun,
    ClaimTerms,
    CompletePasses,
    FilesQueued,
    Lease,
    RunControl,
    Seal,
    SliceRow,
    WorkerRow,
)


def _fence(lease: Lease) -> dict[str, Any]:
    return {"run_id": lease.id, "lease_owner": lease.owner}


def _claim_params(terms: ClaimTerms) -> dict[str, Any]:
    return {
        "worker_id": terms.worker_id,
        "lease": timedelta(seconds=terms.lease_seconds),
        "providers": terms.providers,
        "wakeable": terms.wakeable,
    }


def _seal_params(seal: Seal) -> dict[str, Any]:
    return {
        **_fence(seal.lease),
        "status": seal.status,
        "results": Jsonb(seal.results),
        "attempt_results": Jsonb(seal.attempt_results),
        "error": Jsonb(seal.error) if seal.error else None,
        "processed_units": seal.processed_units,
        "disconnect": seal.disconnect,
    }


class RunStore(PooledStore):
    """The runs path's statements over a pool, on an injectable clock (the time the engine's
    own decisions are taken at; the statements use the database's ``now()``)."""

    def __init__(
        self, pool: Pool, *, clock: Clock | None = None, retry: RetryPolicy = DEFAULT
    ) -> None:
        super().__init__(pool, retry=retry)
        self.clock: Clock = clock or SystemClock()

    def now(self) -> datetime:
        return self.clock.now()

    # -- the API's: runs asked for, cancelled, retried, read ---------------------------------

    def _run_or_none(self, query: Any, params: dict[str, Any]) -> Run | None:
        def call(c: Connection) -> Run | None:
            row = c.execute(query, params).fetchone()
            return None if row is None else Run.from_row(row)

        return self._on_pool(call, idempotent=False)

    def enqueue(
        self, connection_id: int, workspace_id: int | None, trigger: str, max_attempts: int
    ) -> Run | None:
        """Queue a sync of an active connection, or the run already queued or running for it;
        None when the connection is not active (or not in the workspace)."""
        params = {
            "connection_id": connection_id,
            "workspace_id": workspace_id,
            "trigger": trigger,
            "max_attempts": max_attempts,
        }
        return self._run_or_none(QUERIES.enqueue_run, params)

    def cancel(self, run_id: int, workspace_id: int | None) -> Run | None:
        """Cancel a queued sync at once, or ask a running one to stop; None: neither."""
        params = {"run_id": run_id, "workspace_id": workspace_id}
        return self._run_or_none(QUERIES.cancel_run, params)

    def retry(self, run_id: int, workspace_id: int | None, max_attempts: int) -> Run | None:
        """Put a failed run back in the queue with ``max_attempts`` more; None: refused. The
        unique index raises ``UniqueViolation`` while its connection has another active run."""
        params = {"run_id": run_id, "workspace_id": workspace_id, "max_attempts": max_attempts}
        return self._run_or_none(QUERIES.retry_run, params)

    def delete_connection(
        self, connection_id: int, workspace_id: int | None, max_attempts: int
    ) -> Run | None:
        """Mark a connection deleting and queue its purge (or return the purge pending); None:
        no such connection. (A workspace's delete does the same for each of its connections,
        in its transaction: :meth:`TenantStore.delete_workspace`.)"""
        params = {
            "connection_id": connection_id,
            "workspace_id": workspace_id,
            "max_attempts": max_attempts,
        }
        return self._run_or_none(QUERIES.delete_connection, params)

    def get_run(self, run_id: int, workspace_id: int | None) -> Run | None:
        params = {"run_id": run_id, "workspace_id": workspace_id}
        return self._run_or_none(QUERIES.get_run, params)

    def list_runs(
        self,
        *,
        workspace_id: int | None,
        connection_id: int | None,
        status: str | None,
        limit: int,
    ) -> list[Run]:
        """Newest first; a deleted connection's runs are found by its id too."""
        params = {
            "workspace_id": workspace_id,
            "connection_id": connection_id,
            "status": status,
            "limit": limit,
        }
        return self._on_pool(
            lambda c: [Run.from_row(r) for r in c.execute(QUERIES.list_runs, params).fetchall()],
            idempotent=False,
        )

    def attempts(self, run_id: int, workspace_id: int | None) -> list[Attempt]:
        params = {"run_id": run_id, "workspace_id": workspace_id}
        return self._on_pool(
            lambda c: [
                Attempt.from_row(r) for r in c.execute(QUERIES.list_attempts, params).fetchall()
            ],
            idempotent=False,
        )

    def make_due(self, run_id: int) -> bool:
        """For tests (``sync.testing``): a run queued for a later retry or waiting for a rate
        limit becomes due now, its rate budget free; False if the run was not waiting."""
        return self._on_pool(
            lambda c: c.execute(QUERIES.make_run_due, {"run_id": run_id}).fetchone() is not None
        )

    # -- the claim -------------------------------------------------------------------------

    def claim(self, terms: ClaimTerms) -> ClaimedRun | None:
        """The oldest claimable run this worker can execute, now running under a fresh lease
        owner; None when nothing is claimable. Repeated only after a transient failure."""

        def call(conn: Connection) -> ClaimedRun | None:
            row = conn.execute(QUERIES.claim_run, _claim_params(terms)).fetchone()
            return None if row is None else ClaimedRun.from_row(row)

        return self._on_pool(call, idempotent=False)

    # -- the lease keeper's, on its own connection -------------------------------------------

    @staticmethod
    def renew(conn: Connection, lease: Lease, seconds: timedelta) -> bool:
        """Extend a run's lease; False means it is lost."""
        params = {**_fence(lease), "lease": seconds}
        return conn.execute(QUERIES.renew_lease, params).fetchone() is not None

    @staticmethod
    def control(conn: Connection, lease: Lease) -> RunControl | None:
        """Whether the run's holder must stop; None: the lease is lost."""
        row = conn.execute(QUERIES.read_run_control, _fence(lease)).fetchone()
        if row is None:
            return None
        return RunControl(bool(row["cancel_requested"]))

    # -- along the way ---------------------------------------------------------------------

    def save_results(
        self, lease: Lease, results: dict[str, Any], attempt_results: dict[str, Any]
    ) -> bool:
        """Keep the per-table results gathered so far (fenced); False: the lease is lost."""
        params = {
            **_fence(lease),
            "results": Jsonb(results),
            "attempt_results": Jsonb(attempt_results),
        }
        return self._on_pool(
            lambda conn: conn.execute(QUERIES.save_results, params).fetchone() is not None,
            idempotent=False,
        )

    def checkpoints(self, run_id: int) -> list[SliceRow]:
        """Where earlier attempts of the run left each slice of its tables."""
        return self._on_pool(
            lambda conn: [
                SliceRow.from_row(r)
                for r in conn.execute(QUERIES.run_checkpoints, {"run_id": run_id}).fetchall()
            ],
            idempotent=False,
        )

    def last_complete_passes(self, connection_id: int) -> dict[str, CompletePasses]:
        """When each table of a connection, and each partition of it, was last read
        completely."""

        def call(conn: Connection) -> dict[str, CompletePasses]:
            rows = conn.execute(
                QUERIES.last_complete_passes, {"connection_id": connection_id}
            ).fetchall()
            return {
                r["table_name"]: CompletePasses(
                    r["last_full_sync_at"],
                    {p: datetime.fromisoformat(t) for p, t in r["complete_passes"].items()},
                )
                for r in rows
            }

        return self._on_pool(call, idempotent=False)

    def clear_seen_keys(self, run_id: int) -> None:
        """Drop the seen keys a run that has ended left behind."""
        self._on_pool(
            lambda conn: conn.execute(QUERIES.clear_seen_keys, {"run_id": run_id}),
            idempotent=False,
        )

    def queue_file_ingestions(
        self, lease: Lease, connection_id: int, table_name: str, max_attempts: int
    ) -> FilesQueued:
        """The end of a files table's sync, fenced by the run: new and changed files queued
        for ingestion, the documents of tombstoned ones deleted."""
        params = {
            **_fence(lease),
            "connection_id": connection_id,
            "table_name": table_name,
            "max_attempts": max_attempts,
        }
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.queue_file_ingestions, params).fetchone()
        )
        assert row is not None
        return FilesQueued(bool(row["fenced"]), row["queued"], row["deleted"], row["stopped"])

    def block_rate_budget(self, key: str, until: datetime, reason: str) -> None:
        """Record that a shared rate budget is spent until ``until`` (never shortened)."""
        params = {"key": key, "blocked_until": until, "reason": reason}
        self._on_pool(
            lambda conn: conn.execute(QUERIES.block_rate_budget, params), idempotent=False
        )

    def rate_budget_until(self, key: str) -> datetime | None:
        """When a shared rate budget is free again, if a provider said it is spent."""
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.rate_budget_until, {"key": key}).fetchone(),
            idempotent=True,
        )
        return row["blocked_until"] if row else None

    @staticmethod
    def lock_credentials(conn: Connection, lease: Lease, connection_id: int) -> bytes | None:
        """Lock the connection's row for a credential refresh, in the caller's transaction,
        while the lease holds (raises :class:`LeaseLost` otherwise); its stored credentials."""
        row = conn.execute(
            QUERIES.lock_credentials, {**_fence(lease), "connection_id": connection_id}
        ).fetchone()
        if row is None:
            raise LeaseLost()
        credentials: bytes | None = row["credentials"]
        return credentials

    @staticmethod
    def save_credentials(
        conn: Connection,
        connection_id: int,
        credentials: bytes,
        budget_key: str | None,
        *,
        reconnect: bool = False,
    ) -> None:
        """Store re-encrypted credentials under the lock taken by :meth:`lock_credentials`."""
        conn.execute(
            QUERIES.save_credentials,
            {
                "connection_id": connection_id,
                "credentials": credentials,
                "budget_key": budget_key,
                "reconnect": reconnect,
            },
        )

    # -- a purge's batches -----------------------------------------------------------------

    def purge_records_batch(
        self, lease: Lease, connection_id: int, *, limit: int, processed_units: int
    ) -> int:
        """Delete one batch of a deleted connection's records; how many. Fenced."""
        params = {
            **_fence(lease),
            "connection_id": connection_id,
            "limit": limit,
            "processed_units": processed_units,
        }
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.purge_records_batch, params).fetchone(),
            idempotent=False,
        )
        if not row or not row["fenced"]:
            raise LeaseLost()
        deleted: int = row["deleted"]
        return deleted

    def purge_connection_row(self, lease: Lease, connection_id: int) -> None:
        """Remove the deleted connection's table state and row. Fenced."""
        params = {**_fence(lease), "connection_id": connection_id}
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.purge_connection_row, params).fetchone(),
            idempotent=False,
        )
        if not row or not row["fenced"]:
            raise LeaseLost()

    # -- the outcomes ----------------------------------------------------------------------

    def finish(self, seal: Seal) -> bool:
        """Seal the run; False: the lease was lost first. One statement seals the run with its
        totals and the attempt's history row with the attempt's own counts."""
        return self._on_pool(lambda conn: self._finish(conn, seal, None)[0], idempotent=True)

    def finish_and_claim(self, seal: Seal, terms: ClaimTerms) -> tuple[bool, ClaimedRun | None]:
        """Seal the run and claim the next in one round trip. Tried once: a lost answer is
        not repeated as a claim (see :mod:`sync.store.retry`), but as a plain finish, and the
        next run is claimed by the next poll."""
        try:
            with self.pool.connection() as conn:
                return self._finish(conn, seal, terms)
        except Exception as exc:
            if not (is_transient(exc) or is_connection_lost(exc)):
                raise
        return self.finish(seal), None

    @staticmethod
    def _finish(
        conn: Connection, seal: Seal, terms: ClaimTerms | None
    ) -> tuple[bool, ClaimedRun | None]:
        params = _seal_params(seal)
        if terms is not None:
            params |= _claim_params(terms)
        query = QUERIES.finish_run if terms is None else QUERIES.finish_and_claim
        row = conn.execute(query, params).fetchone()
        if row is None:
            return False, None
        claimed = ClaimedRun.from_row(row) if terms is not None and row["id"] is not None else None
        return bool(row["sealed"]), claimed

    def requeue(self, seal: Seal, delay: float) -> str | None:
        """Hand a failed attempt's run back to the queue, due after ``delay`` seconds: the
        status it ended in (``queued``, or ``cancelled`` if its connection is no longer active
        or a cancel was asked); None when the lease is lost."""
        params = {**_seal_params(seal), "delay_seconds": delay}
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.requeue_run, params).fetchone(), idempotent=True
        )
        return None if row is None else str(row["status"])

    def wait_for_rate_limit(self, seal: Seal, delay: float, waiting_for: str) -> str | None:
        """Hand a rate-limited run back, due when the budget is free, spending no attempt: as
        :meth:`requeue`."""
        params = {**_seal_params(seal), "delay_seconds": delay, "waiting_for": waiting_for}
        row = self._on_pool(
            lambda conn: conn.execute(QUERIES.wait_for_rate_limit, params).fetchone(),
            idempotent=True,
        )
        return None if row is None else str(row["status"])

    def hand_back(self, seal: Seal, *, timeout: float | None = None, repeat: bool = True) -> bool:
        """Return the run to the queue at once without spending an attempt (a shutdown, or a
        run claimed but never started); False when the lease is lost. Without ``repeat`` it is
        tried once (a worker closing does not wait for the database: the lease runs out)."""
        params = _seal_params(seal)

        def call() -> bool:
            with self.pool.connection(timeout=timeout) as conn:
                row = conn.execute(QUERIES.hand_back_run, params).fetchone()
            return bool(row and row["moved"])

        return self.retry_policy.run(call, idempotent=True) if repeat else call()

    # -- the ETag cache of conditional requests ---------------------------------------------

    def cached_response(
        self, connection_id: int, url_hash: bytes
    ) -> tuple[str, dict[str, Any], bytes] | None:
        """The ETag, headers and (compressed) body a connection last got from a URL."""
        params = {"connection_id": connection_id, "url_hash": url_hash}
        row = self._on_pool(
            lambda c: c.execute(QUERIES.cached_response, params).fetchone(), idempotent=False
        )
        return None if row is None else (row["etag"], dict(row["headers"]), row["body"])

    def store_response(
        self,
        lease: Lease,
        connection_id: int,
        url_hash: bytes,
        etag: str,
        headers: dict[str, Any],
        body: bytes,
    ) -> None:
        """Keep a response that came with an ETag. Fenced: a stale worker stores nothing."""
        params = {
            **_fence(lease),
            "connection_id": connection_id,
            "url_hash": url_hash,
            "etag": etag,
            "headers": Jsonb(headers),
            "body": body,
        }
        self._on_pool(lambda c: c.execute(QUERIES.store_response, params), idempotent=False)

    # -- schedules -------------------------------------------------------------------------

    def enqueue_due_schedules(self, limit: int, max_attempts: int) -> int:
        """Queue a run for each due active connection (at most ``limit``); how many."""
        params = {"limit": limit, "max_attempts": max_attempts}
        row = self._on_pool(
            lambda c: c.execute(QUERIES.enqueue_due_schedules, params).fetchone(),
            idempotent=False,
        )
        return int(row["queued"]) if row else 0

    # -- workers ---------------------------------------------------------------------------

    def heartbeat(
        self,
        *,
        worker_id: str,
        hostname: str,
        pid: int,
        version: str,
        providers: list[str],
        incarnation: UUID,
        current_run_id: int | None,
    ) -> bool:
        """Say this incarnation is alive and what it runs; False: another process took the
        worker id over."""
        params = {
            "worker_id": worker_id,
            "hostname": hostname,
            "pid": pid,
            "version": version,
            "providers": providers,
            "incarnation": incarnation,
            "current_run_id": current_run_id,
        }
        row = self._on_pool(
            lambda c: c.execute(QUERIES.heartbeat, params).fetchone(), idempotent=False
        )
        return row is not None

    def get_worker(self, conn: Connection, worker_id: str) -> WorkerRow | None:
        row = conn.execute(QUERIES.get_worker, {"worker_id": worker_id}).fetchone()
        return None if row is None else WorkerRow.from_row(row)

    @staticmethod
    def register_worker(
        conn: Connection,
        *,
        worker_id: str,
        hostname: str,
        pid: int,
        version: str,
        providers: list[str],
        incarnation: UUID,
        stale_seconds: float,
        dead: WorkerRow | None,
    ) -> bool:
        """Record this incarnation of the worker id; False while another live one holds it.
        ``dead``: the earlier incarnation the caller found to be a dead process of this host."""
        row = conn.execute(
            QUERIES.register_worker,
            {
                "worker_id": worker_id,
                "hostname": hostname,
                "pid": pid,
                "version": version,
                "providers": providers,
                "incarnation": incarnation,
                "stale_seconds": stale_seconds,
                "dead_pid": dead.pid if dead else None,
                "dead_incarnation": dead.incarnation if dead else None,
            },
        ).fetchone()
        return row is not None

    def worker_stopped(self, worker_id: str, incarnation: UUID, *, timeout: float) -> None:
        """Record an incarnation's stop (never another's)."""
        with self.pool.connection(timeout=timeout) as conn:
            conn.execute(
                QUERIES.worker_stopped, {"worker_id": worker_id, "incarnation": incarnation}
            )
