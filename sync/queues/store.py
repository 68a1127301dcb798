"""The one way in to the application queues' tables: a typed method for each named statement of
``sql/queues.sql``, taking typed arguments and returning typed rows. Nothing here decides
anything; :class:`sync.queues.postgres.PostgresQueues` does, with the pure decisions.

Every method that borrows a connection from the pool repeats itself through the one
:class:`~sync.store.retry.RetryPolicy`: a transient failure always; a lost connection only for
an attempt's end (complete, retry, bury, hand back: fenced by the attempt's token, so a second
try of one that committed matches nothing), never for a claim or a send. A declaration or a
deletion of a queue is one transaction (:meth:`JobStore.changing_queues`), repeated whole after
a transient failure. Methods that take a connection (``conn``) run on it: the lease keeper's.

``now`` is the caller's clock (tests drive one) or None for the database's own time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar
from uuid import UUID

from psycopg import sql
from psycopg.types.json import Jsonb

from sync.queues.declarations import QueueSpec
from sync.queues.models import (
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    QueuePolicy,
    QueueStats,
    Schedule,
)
from sync.queues.sending import Outgoing, SendResult, send_params
from sync.store.db import Connection
from sync.store.pooled import PooledStore
from sync.store.queries import NamedQueries

Row = dict[str, Any]
T = TypeVar("T")

QUEUE_QUERIES = NamedQueries("queues.sql")
# The statements run on a caller's own connection (sync.queues.caller), schema-qualified.
_CALLER_QUERIES = NamedQueries("queues_caller.sql")


@lru_cache(maxsize=64)
def caller_statement(name: str, schema: str) -> sql.Composed:
    """A statement of ``sql/queues_caller.sql`` with its schema filled in, built once."""
    return _CALLER_QUERIES[name].format(schema=sql.Identifier(schema))


@dataclass(frozen=True)
class ClaimedJob:
    """An attempt a claim started (or a job it dead-lettered, ``job.status`` dead), with the
    retry terms of its queue as the claim read them."""

    job: Job
    lease_owner: UUID
    spec: QueueSpec


@dataclass(frozen=True)
class Cancelled:
    previous: JobStatus | None  # None: no such job
    job: Job | None  # the cancelled job, when it could be cancelled
    lease_owner: UUID | None  # its attempt's token, when it was active


_STATUS = {status.value: status for status in JobStatus}  # a dict reads faster than a call


def job_from_row(row: Row) -> Job:
    return Job(
        id=row["id"],
        queue=row["queue"],
        origin_queue=row["origin_queue"],
        payload=row["payload"],
        key=row["key"],
        status=_STATUS[row["status"]],
        attempts=row["attempts"],
        run_after=row["run_after"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        expires_at=row["expires_at"],
        error=row["error"],
        tick=row["tick"],
        processed_units=row["processed_units"],
        total_units=row["total_units"],
        priority=row["priority"],
    )


# The columns of the claim statement, in its order: a job's, its token, its queue's retry terms.
_CLAIM_COLUMNS = [*(f.name for f in fields(Job)), "lease_owner"]
_CLAIM_COLUMNS += ["retry_limit", "retry_delay", "retry_ceiling", "expire"]


def _claimed_job(cursor: Any) -> Callable[[Sequence[Any]], ClaimedJob]:
    """A row factory: the claim statement's row, read by position, as its :class:`ClaimedJob`.
    Only the count of its columns is checked at each claim: reading their names costs more
    than the rest of a one-job claim's rows."""
    result = cursor.pgresult
    if result is None or result.nfields != len(_CLAIM_COLUMNS):
        raise RuntimeError("the claim statement does not return a claimed job's columns")

    def make(row: Sequence[Any]) -> ClaimedJob:
        job = Job(
            row[0], row[1], row[2], row[3], row[4], _STATUS[row[5]], row[6], row[7], row[8],
            row[9], row[10], row[11], row[12], row[13], row[14], row[15], row[16],
        )  # fmt: skip
        spec = _claimed_spec(row[2], row[18], row[19], row[20], row[21])
        return ClaimedJob(job, row[17], spec)

    return make


@lru_cache(maxsize=256)
def _claimed_spec(
    name: str, retry_limit: int, retry_delay: float, retry_ceiling: float, expire: float
) -> QueueSpec:
    """The retry terms a claim read with its jobs, validated once per distinct set (a claim of
    100 jobs of one queue builds one, not 100; the spec is frozen, so they share it)."""
    return QueueSpec(
        name=name,
        retry_limit=retry_limit,
        retry_delay=retry_delay,
        retry_ceiling=retry_ceiling,
        expire=expire,
    )


def spec_from_row(row: Row) -> QueueSpec:
    return QueueSpec(
        name=row["name"],
        policy=QueuePolicy(row["policy"]),
        retry_limit=row["retry_limit"],
        retry_delay=row["retry_delay"],
        retry_ceiling=row["retry_ceiling"],
        expire=row["expire"],
        dead_letter=row["dead_letter"],
        retention=row["retention"],
        priority=row["priority"],
        priority_step=row["priority_step"],
        global_concurrency=row["global_concurrency"],
        rate_limit=row["rate_limit"],
        rate_period=row["rate_period"],
    )


def stats_from_row(row: Row) -> QueueStats:
    return QueueStats(
        name=row["name"],
        policy=QueuePolicy(row["policy"]),
        queued=row["queued"],
        active=row["active"],
        retrying=row["retrying"],
        dead=row["dead"],
        oldest_due_at=row["oldest_due_at"],
    )


def attempt_from_row(row: Row) -> JobAttempt:
    return JobAttempt(
        job_id=row["job_id"],
        attempt=row["attempt"],
        queue=row["queue"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=AttemptOutcome(row["outcome"]) if row["outcome"] else None,
        error=row["error"],
    )


def cancelled_from_row(row: Row | None) -> Cancelled:
    if row is None:
        return Cancelled(None, None, None)
    previous = JobStatus(row["previous"])
    if row["id"] is None:
        return Cancelled(previous, None, None)
    owner = row["lease_owner"] if previous is JobStatus.ACTIVE else None
    return Cancelled(previous, job_from_row(row), owner)


def _schedule(row: Row) -> Schedule:
    return Schedule(
        queue=row["queue"],
        cron=row["cron"],
        payload=row["payload"],
        next_tick=row["next_tick"],
        last_tick=row["last_tick"],
    )


class QueueChanges:
    """The statements of a declaration or deletion of a queue, in the transaction of
    :meth:`JobStore.changing_queues` on ``conn``."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def get_queue(self, name: str) -> QueueSpec | None:
        row = self._conn.execute(QUEUE_QUERIES.get_queue, {"name": name}).fetchone()
        return None if row is None else spec_from_row(row)

    def lock_queue(self, name: str) -> QueueSpec | None:
        row = self._conn.execute(QUEUE_QUERIES.lock_queue, {"name": name}).fetchone()
        return None if row is None else spec_from_row(row)

    def count_pending(self, name: str) -> int:
        row = self._conn.execute(QUEUE_QUERIES.count_pending, {"name": name}).fetchone()
        assert row is not None
        return int(row["pending"])

    def dead_letter_users(self, name: str) -> list[str]:
        rows = self._conn.execute(QUEUE_QUERIES.dead_letter_users, {"name": name}).fetchall()
        return [r["name"] for r in rows]

    def upsert_queue(self, spec: QueueSpec) -> QueueSpec:
        params = {**spec.model_dump(), "policy": spec.policy.value}
        row = self._conn.execute(QUEUE_QUERIES.upsert_queue, params).fetchone()
        assert row is not None
        return spec_from_row(row)

    def delete_queue(self, name: str) -> None:
        self._conn.execute(QUEUE_QUERIES.delete_queue_jobs, {"name": name})
        self._conn.execute(QUEUE_QUERIES.delete_queue, {"name": name})


class JobStore(PooledStore):
    """The application queues' statements over a pool."""

    # Queues

    def changing_queues(self, call: Callable[[QueueChanges], T]) -> T:
        """``call`` in one transaction, repeated whole after a transient failure: it must do
        nothing outside the database that a second try would do twice. An error it raises
        rolls the transaction back and reaches the caller."""
        return self._in_transaction(lambda conn: call(QueueChanges(conn)))

    def get_queue(self, name: str) -> QueueSpec | None:
        row = self._one(QUEUE_QUERIES.get_queue, {"name": name})
        return None if row is None else spec_from_row(row)

    def list_queues(self) -> list[QueueSpec]:
        return [spec_from_row(r) for r in self._all(QUEUE_QUERIES.list_queues, {})]

    # Jobs

    def send(self, outgoing: Outgoing, now: datetime | None) -> list[SendResult]:
        """Queue the jobs of ``outgoing`` in one statement (on its own transaction)."""
        if len(outgoing.payloads) == 1:
            row = self._one(QUEUE_QUERIES.send_job, send_params(outgoing, now))
            assert row is not None
            return [SendResult(row["job_id"], row["outcome"])]
        rows = self._all(QUEUE_QUERIES.send_jobs, send_params(outgoing, now))
        return [SendResult(r["job_id"], r["outcome"]) for r in rows]

    def wake_queue(self, queue: str) -> None:
        """Wake the lanes of ``queue`` on every worker (a NOTIFY on the engine's channel)."""
        self._one(QUEUE_QUERIES.wake_queue, {"queue": queue})

    def current_schema(self) -> str:
        row = self._one(QUEUE_QUERIES.current_schema, {})
        assert row is not None
        return str(row["schema"])

    def get_job(self, job_id: int) -> Job | None:
        row = self._one(QUEUE_QUERIES.get_job, {"job_id": job_id})
        return None if row is None else job_from_row(row)

    def list_jobs(self, queue: str | None, status: JobStatus | None, limit: int) -> list[Job]:
        params = {"queue": queue, "status": status.value if status else None, "limit": limit}
        return [job_from_row(r) for r in self._all(QUEUE_QUERIES.list_jobs, params)]

    def attempts(self, job_id: int) -> list[JobAttempt]:
        rows = self._all(QUEUE_QUERIES.job_attempts, {"job_id": job_id})
        return [attempt_from_row(r) for r in rows]

    def claim(
        self, queues: list[str], limit: int, lease: float, now: datetime | None
    ) -> list[ClaimedJob]:
        params = {"queues": queues, "limit": limit, "lease": lease, "now": now}
        # Binary results, each row made into its ClaimedJob at once: a batch's timestamps and
        # uuids parse faster than from text, and no row dict is built on the way.
        return self._on_pool(
            lambda c: (
                c.cursor(row_factory=_claimed_job, binary=True)
                .execute(QUEUE_QUERIES.claim_jobs, params)
                .fetchall()
            )
        )

    # An attempt's ends, each fenced by its token

    def complete(self, job_id: int, owner: UUID, now: datetime | None) -> bool:
        params = {"job_id": job_id, "lease_owner": owner, "now": now}
        return self._one(QUEUE_QUERIES.complete_attempt, params, idempotent=True) is not None

    def complete_many(self, attempts: list[tuple[int, UUID]], now: datetime | None) -> set[int]:
        """Complete several attempts in one statement; the ids of the jobs it completed."""
        params = {
            "job_ids": [job_id for job_id, _ in attempts],
            "lease_owners": [owner for _, owner in attempts],
            "now": now,
        }
        rows = self._all(QUEUE_QUERIES.complete_attempts, params, idempotent=True)
        return {r["job_id"] for r in rows}

    def retry(
        self, job_id: int, owner: UUID, error: str, delay: float, now: datetime | None
    ) -> bool:
        params = {
            "job_id": job_id,
            "lease_owner": owner,
            "error": error,
            "delay": delay,
            "now": now,
        }
        return self._one(QUEUE_QUERIES.retry_attempt, params, idempotent=True) is not None

    def bury(self, job_id: int, owner: UUID, error: str, now: datetime | None) -> Job | None:
        params = {"job_id": job_id, "lease_owner": owner, "error": error, "now": now}
        row = self._one(QUEUE_QUERIES.bury_attempt, params, idempotent=True)
        return None if row is None else job_from_row(row)

    def hand_back(
        self, job_id: int, owner: UUID, now: datetime | None, *, closing: bool = False
    ) -> bool:
        """Back to its queue without spending an attempt; False: the attempt lost the job.
        ``closing``: the worker is closing and does not wait for the database, so a lost
        connection is not repeated (the lease runs out)."""
        params = {"job_id": job_id, "lease_owner": owner, "now": now}
        query = QUEUE_QUERIES.hand_back_attempt
        return self._one(query, params, idempotent=not closing) is not None

    def report_progress(
        self, job_id: int, owner: UUID, processed: int, total: int | None, now: datetime | None
    ) -> bool:
        params = {
            "job_id": job_id,
            "lease_owner": owner,
            "processed": processed,
            "total": total,
            "now": now,
        }
        return self._one(QUEUE_QUERIES.report_progress, params) is not None

    # The lease keeper's, on its own connection

    @staticmethod
    def renew(conn: Connection, job_id: int, owner: UUID, lease: timedelta) -> bool:
        """Extend an attempt's lease on ``conn`` (the lease keeper's own); False if lost."""
        row = conn.execute(
            QUEUE_QUERIES.renew_job_lease, {"job_id": job_id, "lease_owner": owner, "lease": lease}
        ).fetchone()
        return row is not None

    @staticmethod
    def control(conn: Connection, job_id: int, owner: UUID) -> tuple[JobStatus, bool] | None:
        """The job's status and whether ``owner`` is its latest attempt's token."""
        row = conn.execute(
            QUEUE_QUERIES.read_job_control, {"job_id": job_id, "lease_owner": owner}
        ).fetchone()
        return None if row is None else (JobStatus(row["status"]), bool(row["ours"]))

    @staticmethod
    def renew_many(
        conn: Connection, leases: list[tuple[int, UUID, timedelta]]
    ) -> set[tuple[int, UUID]]:
        """Extend many attempts' leases (job, token, length) in one statement on ``conn``; the
        (job, token) pairs renewed (the others are lost)."""
        rows = conn.execute(
            QUEUE_QUERIES.renew_job_leases,
            {
                "job_ids": [job_id for job_id, _, _ in leases],
                "lease_owners": [owner for _, owner, _ in leases],
                "seconds": [length.total_seconds() for _, _, length in leases],
            },
        ).fetchall()
        return {(r["id"], r["lease_owner"]) for r in rows}

    @staticmethod
    def control_many(
        conn: Connection, leases: list[tuple[int, UUID]]
    ) -> dict[tuple[int, UUID], tuple[JobStatus, bool] | None]:
        """:meth:`control` of many attempts (job, token) in one statement."""
        rows = conn.execute(
            QUEUE_QUERIES.read_job_controls,
            {
                "job_ids": [job_id for job_id, _ in leases],
                "lease_owners": [owner for _, owner in leases],
            },
        ).fetchall()
        return {
            (r["id"], r["owner"]): (
                None if r["status"] is None else (JobStatus(r["status"]), bool(r["ours"]))
            )
            for r in rows
        }

    # An operator's

    def cancel(self, job_id: int, now: datetime | None) -> Cancelled:
        return cancelled_from_row(
            self._one(QUEUE_QUERIES.cancel_job, {"job_id": job_id, "now": now})
        )

    def make_retrying_due(self, job_id: int, now: datetime | None) -> Job | None:
        row = self._one(QUEUE_QUERIES.make_retrying_due, {"job_id": job_id, "now": now})
        return None if row is None else job_from_row(row)

    def requeue(self, job_id: int, now: datetime | None) -> Job | None:
        """Raises psycopg's UniqueViolation when another pending job holds the slot."""
        row = self._one(QUEUE_QUERIES.requeue_job, {"job_id": job_id, "now": now})
        return None if row is None else job_from_row(row)

    def slot_holder(self, queue: str, key: str | None) -> int | None:
        row = self._one(QUEUE_QUERIES.slot_holder, {"queue": queue, "key": key})
        return None if row is None else int(row["id"])

    def dead_jobs(self, queue: str) -> list[int]:
        return [r["id"] for r in self._all(QUEUE_QUERIES.dead_jobs, {"queue": queue})]

    # Cron

    def upsert_schedule(self, queue: str, cron: str, payload: Any, next_tick: datetime) -> Schedule:
        params = {"queue": queue, "cron": cron, "payload": Jsonb(payload), "next_tick": next_tick}
        row = self._one(QUEUE_QUERIES.upsert_schedule, params)
        assert row is not None
        return _schedule(row)

    def delete_schedule(self, queue: str) -> bool:
        return self._one(QUEUE_QUERIES.delete_schedule, {"queue": queue}) is not None

    def list_schedules(self) -> list[Schedule]:
        return [_schedule(r) for r in self._all(QUEUE_QUERIES.list_schedules, {})]

    def due_schedules(self, now: datetime | None) -> list[tuple[str, str, datetime]]:
        rows = self._all(QUEUE_QUERIES.due_schedules, {"now": now})
        return [(r["queue"], r["cron"], r["next_tick"]) for r in rows]

    def fire_schedule(
        self,
        queue: str,
        expected: datetime,
        tick: datetime,
        next_tick: datetime,
        now: datetime | None,
    ) -> int | None:
        params = {
            "queue": queue,
            "expected": expected,
            "tick": tick,
            "next_tick": next_tick,
            "now": now,
        }
        row = self._one(QUEUE_QUERIES.fire_schedule, params)
        return None if row is None else row["job_id"]

    def database_now(self) -> datetime:
        row = self._one(QUEUE_QUERIES.database_now, {})
        assert row is not None
        moment: datetime = row["now"]
        return moment

    # What operators read; retention; workers

    def queue_stats(self, now: datetime | None) -> list[QueueStats]:
        return [stats_from_row(r) for r in self._all(QUEUE_QUERIES.queue_stats, {"now": now})]

    def prune(self, now: datetime | None, limit: int) -> int:
        return len(self._all(QUEUE_QUERIES.prune_jobs, {"now": now, "limit": limit}))

    def set_worker_lanes(self, worker_id: str, incarnation: UUID, lanes: dict[str, int]) -> None:
        params = {
            "worker_id": worker_id,
            "incarnation": incarnation,
            "lanes": Jsonb(lanes) if lanes else None,
        }
        self._on_pool(lambda c: c.execute(QUEUE_QUERIES.set_worker_lanes, params))

    def lanes_online(self, stale_seconds: float) -> dict[str, int]:
        rows = self._all(QUEUE_QUERIES.lanes_online, {"stale_seconds": stale_seconds})
        return {r["queue"]: r["lanes"] for r in rows}
