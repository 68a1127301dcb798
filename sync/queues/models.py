"""The application queues' vocabulary: a job and its statuses, a queue's policy, an attempt, a
cron schedule, and what operators read (per-queue figures, a redrive's result). Plain frozen
records; both implementations of the port return exactly these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobStatus(StrEnum):
    """Where a job is in its life. pg-boss calls these created, active, retry, completed, failed
    and cancelled; River and Oban say available/scheduled, running/executing, retryable,
    completed, discarded and cancelled."""

    QUEUED = "queued"  # waiting for its time (run_after) and a free lane
    ACTIVE = "active"  # an attempt is running, under a lease that expires
    RETRYING = "retrying"  # an attempt failed; queued again, due at run_after
    COMPLETED = "completed"  # a handler returned
    DEAD = "dead"  # out of attempts: it waits in its dead-letter queue for a person
    CANCELLED = "cancelled"  # cancelled by an operator or the application


# A job in one of these is work still to do: on an exclusive queue it holds its singleton key.
PENDING = frozenset({JobStatus.QUEUED, JobStatus.RETRYING, JobStatus.ACTIVE})
# A job in one of these never runs again unless it is retried or redriven.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED})


class QueuePolicy(StrEnum):
    STANDARD = "standard"  # any number of jobs, many at once
    EXCLUSIVE = "exclusive"  # one pending job per singleton key; a duplicate send returns it


class AttemptOutcome(StrEnum):
    COMPLETED = "completed"  # the handler returned
    FAILED = "failed"  # the handler raised
    EXPIRED = "expired"  # the attempt outlived the queue's expiry and a claim took it back
    CANCELLED = "cancelled"  # the job was cancelled while the attempt ran


@dataclass(frozen=True)
class Job:
    id: int
    # Where the job is now: the queue it was sent to, or its dead-letter queue once dead.
    queue: str
    # The queue it was sent to, whose handler runs it; a redrive sends it back there.
    origin_queue: str
    payload: Any  # a JSON value, exactly as JSON keeps it (tuples come back as lists)
    key: str | None  # the singleton key (exclusive queues only)
    status: JobStatus
    attempts: int  # attempts spent since it was sent, retried or redriven
    run_after: datetime  # when it is due (queued or retrying)
    created_at: datetime
    started_at: datetime | None  # the latest attempt's start
    finished_at: datetime | None
    expires_at: datetime | None  # while active: when a claim may take the attempt back
    error: str | None  # the latest failure, one line
    tick: datetime | None  # the cron tick that sent it, if a schedule did
    # Progress its handler reported (``abort.report_progress``), if any.
    processed_units: int | None = None
    total_units: int | None = None
    # 0 runs first, 9 last (see docs/queues.md for how long a job may wait behind better ones).
    priority: int = 0


@dataclass(frozen=True)
class JobAttempt:
    job_id: int
    attempt: int  # 1-based, counted since the job was sent, retried or redriven
    queue: str
    started_at: datetime
    finished_at: datetime | None  # None while it runs
    outcome: AttemptOutcome | None  # None while it runs
    error: str | None


@dataclass(frozen=True)
class Schedule:
    """A cron schedule: each tick of ``cron`` (UTC) sends one job with ``payload`` to ``queue``."""

    queue: str
    cron: str
    payload: Any
    next_tick: datetime  # the first tick not fired yet
    last_tick: datetime | None  # the latest tick fired


@dataclass(frozen=True)
class QueueStats:
    name: str
    policy: QueuePolicy
    queued: int
    active: int
    retrying: int
    dead: int
    oldest_due_at: datetime | None  # the earliest run_after among due queued or retrying jobs


@dataclass(frozen=True)
class Redrive:
    """What a redrive did: jobs sent back to their queue, and dead jobs left where they are
    because their queue is gone or already holds a pending job with their singleton key."""

    redriven: tuple[int, ...]
    skipped: tuple[int, ...]
