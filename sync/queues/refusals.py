"""The errors an operator's call on a job can meet, worded once for the sync and the async
Postgres implementations: each says what is wrong and what to do instead."""

from __future__ import annotations

from sync.errors import Conflict, InvalidInput, NotFound
from sync.queues.models import Job, JobStatus

MAX_LIST = 1000


def check_list_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIST:
        raise InvalidInput(f"limit must be from 1 to {MAX_LIST}, not {limit}")


def no_job(job_id: int) -> NotFound:
    return NotFound(f"no job {job_id}")


def no_such_queue(name: str) -> NotFound:
    return NotFound(f"no queue named {name!r}; declare it first")


def cannot_cancel(job_id: int, status: JobStatus) -> Conflict:
    return Conflict(
        f"job {job_id} is {status}; only queued, retrying or active jobs can be cancelled"
    )


def cannot_retry(job_id: int, status: JobStatus) -> Conflict:
    return Conflict(
        f"job {job_id} is {status}; only dead, cancelled or retrying jobs can be retried "
        "(send a new job instead)"
    )


def slot_taken(job: Job, holder: int | None) -> Conflict:
    return Conflict(
        f"job {job.id} cannot go back to queue {job.origin_queue!r}: job {holder} with the "
        "same key is pending there and does its work"
    )


def queue_gone(job: Job) -> NotFound:
    return NotFound(
        f"job {job.id}'s queue {job.origin_queue!r} no longer exists; declare it again to "
        "retry the job"
    )
