"""The one way in to the application queues' tables: a typed method for each named statement of
``sql/queues.sql``, taking typed arguments and returning typed rows. Nothing here decides
anything; :class:`sync.queues.postgres.PostgresQueues` does, with the pure decisions.

``now`` is the caller's clock (tests drive one) or None for the database's own time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Protocol
from uuid import UUID

from psycopg import Connection
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
from sync.store.queries import NamedQueries

Row = dict[str, Any]


class ConnectionSource(Protocol):
    """Where connections come from: a psycopg pool of autocommit connections with dict rows and
    the schema on their search_path (the engine's pool is one)."""

    def connection(self, timeout: float | None = None) -> Any: ...


QUEUE_QUERIES = NamedQueries("queues.sql")


@dataclass(frozen=True)
class ClaimedJob:
    """An attempt a claim started (or a job it dead-lettered, ``job.status`` dead), with the
    retry terms of its queue as the claim read them."""

    job: Job
    lease_owner: UUID
    spec: QueueSpec


@dataclass(frozen=True)
class SendResult:
    job_id: int | None
    outcome: str  # created | existing | no_queue | key_on_standard


@dataclass(frozen=True)
class Cancelled:
    previous: JobStatus | None  # None: no such job
    job: Job | None  # the cancelled job, when it could be cancelled
    lease_owner: UUID | None  # its attempt's token, when it was active


def job_from_row(row: Row) -> Job:
    return Job(
        id=row["id"],
        queue=row["queue"],
        origin_queue=row["origin_queue"],
        payload=row["payload"],
        key=row["key"],
        status=JobStatus(row["status"]),
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
    )


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
    )


def _schedule(row: Row) -> Schedule:
    return Schedule(
        queue=row["queue"],
        cron=row["cron"],
        payload=row["payload"],
        next_tick=row["next_tick"],
        last_tick=row["last_tick"],
    )


class JobStore:
    def __init__(self, pool: ConnectionSource) -> None:
        self._pool = pool

    @contextmanager
    def transaction(self) -> Iterator[Connection[Row]]:
        with self._pool.connection() as conn, conn.transaction():
            yield conn

    def _one(
        self, statement: str, conn: Connection[Row] | None = None, **params: Any
    ) -> Row | None:
        if conn is not None:
            return conn.execute(QUEUE_QUERIES[statement], params).fetchone()
        with self._pool.connection() as own:
            row: Row | None = own.execute(QUEUE_QUERIES[statement], params).fetchone()
            return row

    def _all(self, statement: str, conn: Connection[Row] | None = None, **params: Any) -> list[Row]:
        if conn is not None:
            return conn.execute(QUEUE_QUERIES[statement], params).fetchall()
        with self._pool.connection() as own:
            rows: list[Row] = own.execute(QUEUE_QUERIES[statement], params).fetchall()
            return rows

    # Queues

    def get_queue(self, name: str, conn: Connection[Row] | None = None) -> QueueSpec | None:
        row = self._one("get_queue", conn, name=name)
        return None if row is None else spec_from_row(row)

    def list_queues(self) -> list[QueueSpec]:
        return [spec_from_row(r) for r in self._all("list_queues")]

    def lock_queue(self, conn: Connection[Row], name: str) -> QueueSpec | None:
        row = self._one("lock_queue", conn, name=name)
        return None if row is None else spec_from_row(row)

    def count_pending(self, conn: Connection[Row], name: str) -> int:
        row = self._one("count_pending", conn, name=name)
        assert row is not None
        return int(row["pending"])

    def dead_letter_users(self, conn: Connection[Row], name: str) -> list[str]:
        return [r["name"] for r in self._all("dead_letter_users", conn, name=name)]

    def upsert_queue(self, conn: Connection[Row], spec: QueueSpec) -> QueueSpec:
        row = self._one("upsert_queue", conn, **{**spec.model_dump(), "policy": spec.policy.value})
        assert row is not None
        return spec_from_row(row)

    def delete_queue(self, conn: Connection[Row], name: str) -> None:
        conn.execute(QUEUE_QUERIES.delete_queue_jobs, {"name": name})
        conn.execute(QUEUE_QUERIES.delete_queue, {"name": name})

    # Jobs

    def send(
        self,
        queue: str,
        payload: Any,
        key: str | None,
        *,
        now: datetime | None,
        delay: float | None,
        at: datetime | None,
    ) -> SendResult:
        row = self._one(
            "send_job", queue=queue, payload=Jsonb(payload), key=key, now=now, delay=delay, at=at
        )
        assert row is not None
        return SendResult(row["job_id"], row["outcome"])

    def get_job(self, job_id: int) -> Job | None:
        row = self._one("get_job", job_id=job_id)
        return None if row is None else job_from_row(row)

    def list_jobs(self, queue: str | None, status: JobStatus | None, limit: int) -> list[Job]:
        rows = self._all(
            "list_jobs", queue=queue, status=status.value if status else None, limit=limit
        )
        return [job_from_row(r) for r in rows]

    def attempts(self, job_id: int) -> list[JobAttempt]:
        return [
            JobAttempt(
                job_id=r["job_id"],
                attempt=r["attempt"],
                queue=r["queue"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
                outcome=AttemptOutcome(r["outcome"]) if r["outcome"] else None,
                error=r["error"],
            )
            for r in self._all("job_attempts", job_id=job_id)
        ]

    def claim(
        self, queues: list[str], limit: int, lease: float, now: datetime | None
    ) -> list[ClaimedJob]:
        rows = self._all("claim_jobs", queues=queues, limit=limit, lease=lease, now=now)
        return [
            ClaimedJob(
                job=job_from_row(r),
                lease_owner=r["lease_owner"],
                spec=_claimed_spec(
                    r["origin_queue"],
                    r["retry_limit"],
                    r["retry_delay"],
                    r["retry_ceiling"],
                    r["expire"],
                ),
            )
            for r in rows
        ]

    def complete(self, job_id: int, owner: UUID, now: datetime | None) -> bool:
        return self._one("complete_attempt", job_id=job_id, lease_owner=owner, now=now) is not None

    def complete_many(self, attempts: list[tuple[int, UUID]], now: datetime | None) -> set[int]:
        """Complete several attempts in one statement; the ids of the jobs it completed."""
        rows = self._all(
            "complete_attempts",
            job_ids=[job_id for job_id, _ in attempts],
            lease_owners=[owner for _, owner in attempts],
            now=now,
        )
        return {r["job_id"] for r in rows}

    def retry(
        self, job_id: int, owner: UUID, error: str, delay: float, now: datetime | None
    ) -> bool:
        row = self._one(
            "retry_attempt", job_id=job_id, lease_owner=owner, error=error, delay=delay, now=now
        )
        return row is not None

    def bury(self, job_id: int, owner: UUID, error: str, now: datetime | None) -> Job | None:
        row = self._one("bury_attempt", job_id=job_id, lease_owner=owner, error=error, now=now)
        return None if row is None else job_from_row(row)

    def hand_back(self, job_id: int, owner: UUID, now: datetime | None) -> bool:
        return self._one("hand_back_attempt", job_id=job_id, lease_owner=owner, now=now) is not None

    def report_progress(
        self, job_id: int, owner: UUID, processed: int, total: int | None, now: datetime | None
    ) -> bool:
        row = self._one(
            "report_progress",
            job_id=job_id,
            lease_owner=owner,
            processed=processed,
            total=total,
            now=now,
        )
        return row is not None

    @staticmethod
    def renew(conn: Connection[Row], job_id: int, owner: UUID, lease: timedelta) -> bool:
        """Extend an attempt's lease on ``conn`` (the lease keeper's own); False if lost."""
        row = conn.execute(
            QUEUE_QUERIES.renew_job_lease, {"job_id": job_id, "lease_owner": owner, "lease": lease}
        ).fetchone()
        return row is not None

    @staticmethod
    def control(conn: Connection[Row], job_id: int, owner: UUID) -> tuple[JobStatus, bool] | None:
        """The job's status and whether ``owner`` is its latest attempt's token."""
        row = conn.execute(
            QUEUE_QUERIES.read_job_control, {"job_id": job_id, "lease_owner": owner}
        ).fetchone()
        return None if row is None else (JobStatus(row["status"]), bool(row["ours"]))

    @staticmethod
    def renew_many(
        conn: Connection[Row], leases: list[tuple[int, UUID, timedelta]]
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
        conn: Connection[Row], leases: list[tuple[int, UUID]]
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

    def cancel(self, job_id: int, now: datetime | None) -> Cancelled:
        row = self._one("cancel_job", job_id=job_id, now=now)
        if row is None:
            return Cancelled(None, None, None)
        previous = JobStatus(row["previous"])
        if row["id"] is None:
            return Cancelled(previous, None, None)
        owner = row["lease_owner"] if previous is JobStatus.ACTIVE else None
        return Cancelled(previous, job_from_row(row), owner)

    def make_retrying_due(self, job_id: int, now: datetime | None) -> Job | None:
        row = self._one("make_retrying_due", job_id=job_id, now=now)
        return None if row is None else job_from_row(row)

    def requeue(self, job_id: int, now: datetime | None) -> Job | None:
        """Raises psycopg's UniqueViolation when another pending job holds the slot."""
        with self.transaction() as conn:
            row = self._one("requeue_job", conn, job_id=job_id, now=now)
        return None if row is None else job_from_row(row)

    def slot_holder(self, queue: str, key: str | None) -> int | None:
        row = self._one("slot_holder", queue=queue, key=key)
        return None if row is None else int(row["id"])

    def dead_jobs(self, queue: str) -> list[int]:
        return [r["id"] for r in self._all("dead_jobs", queue=queue)]

    # Cron

    def upsert_schedule(self, queue: str, cron: str, payload: Any, next_tick: datetime) -> Schedule:
        row = self._one(
            "upsert_schedule", queue=queue, cron=cron, payload=Jsonb(payload), next_tick=next_tick
        )
        assert row is not None
        return _schedule(row)

    def delete_schedule(self, queue: str) -> bool:
        return self._one("delete_schedule", queue=queue) is not None

    def list_schedules(self) -> list[Schedule]:
        return [_schedule(r) for r in self._all("list_schedules")]

    def due_schedules(self, now: datetime | None) -> list[tuple[str, str, datetime]]:
        return [
            (r["queue"], r["cron"], r["next_tick"]) for r in self._all("due_schedules", now=now)
        ]

    def fire_schedule(
        self,
        queue: str,
        expected: datetime,
        tick: datetime,
        next_tick: datetime,
        now: datetime | None,
    ) -> int | None:
        row = self._one(
            "fire_schedule",
            queue=queue,
            expected=expected,
            tick=tick,
            next_tick=next_tick,
            now=now,
        )
        return None if row is None else row["job_id"]

    def database_now(self) -> datetime:
        row = self._one("database_now")
        assert row is not None
        moment: datetime = row["now"]
        return moment

    # What operators read; retention; workers

    def queue_stats(self, now: datetime | None) -> list[QueueStats]:
        return [
            QueueStats(
                name=r["name"],
                policy=QueuePolicy(r["policy"]),
                queued=r["queued"],
                active=r["active"],
                retrying=r["retrying"],
                dead=r["dead"],
                oldest_due_at=r["oldest_due_at"],
            )
            for r in self._all("queue_stats", now=now)
        ]

    def prune(self, now: datetime | None, limit: int) -> int:
        return len(self._all("prune_jobs", now=now, limit=limit))

    def set_worker_lanes(self, worker_id: str, incarnation: UUID, lanes: dict[str, int]) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                QUEUE_QUERIES.set_worker_lanes,
                {
                    "worker_id": worker_id,
                    "incarnation": incarnation,
                    "lanes": Jsonb(lanes) if lanes else None,
                },
            )

    def lanes_online(self, stale_seconds: float) -> dict[str, int]:
        rows = self._all("lanes_online", stale_seconds=stale_seconds)
        return {r["queue"]: r["lanes"] for r in rows}
