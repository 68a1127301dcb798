"""A send as every implementation takes it: the checks a send must pass before it reaches a
queue (key, priority, payload, start), the send as the database takes it (:class:`Outgoing`),
and what its outcome means to the caller (a job id, or one clear error). The Postgres
implementations, sync and async, on their own connections or the caller's, share these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from sync.errors import InvalidInput, NotFound
from sync.queues.admission import check_key_text, due_time, key_on_standard
from sync.queues.declarations import MAX_PRIORITY, MIN_PRIORITY
from sync.queues.payloads import json_payload

# The most jobs one send_many takes: one statement, one round trip.
MAX_SEND_MANY = 1000


@dataclass(frozen=True)
class SendResult:
    job_id: int | None
    outcome: str  # created | existing | no_queue | key_on_standard


@dataclass(frozen=True)
class Outgoing:
    """Jobs for one queue as the database takes them: JSON payloads, a start given either as a
    delay in seconds (the database's clock) or as a time."""

    queue: str
    payloads: list[Any]
    key: str | None
    priority: int | None
    delay: float | None
    at: datetime | None


def check_priority(queue: str, priority: int | None) -> None:
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput(
            f"the priority of a job for queue {queue!r} must be a whole number from "
            f"{MIN_PRIORITY} to {MAX_PRIORITY}"
        )
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidInput(
            f"the priority of a job for queue {queue!r} must be from {MIN_PRIORITY} (first) to "
            f"{MAX_PRIORITY} (last), not {priority}"
        )


def outgoing(
    queue: str,
    payloads: Iterable[Any],
    *,
    key: str | None,
    start_after: datetime | timedelta | None,
    priority: int | None,
    now: datetime | None,
) -> Outgoing:
    """The checked send; ``now`` is the caller's clock, or None for the database's."""
    check_key_text(queue, key)
    check_priority(queue, priority)
    values = [json_payload(queue, payload) for payload in payloads]
    if not 1 <= len(values) <= MAX_SEND_MANY:
        raise InvalidInput(
            f"send_many to queue {queue!r} takes 1 to {MAX_SEND_MANY} payloads, not {len(values)}"
        )
    delay, at = _start(now, start_after)
    return Outgoing(queue, values, key, priority, delay, at)


def send_params(sent: Outgoing, now: datetime | None) -> dict[str, Any]:
    """The parameters of the send statements (``send_job``, ``send_jobs``)."""
    return {
        "queue": sent.queue,
        "payload": Jsonb(sent.payloads[0]),
        "payloads": [Jsonb(p) for p in sent.payloads],
        "key": sent.key,
        "now": now,
        "delay": sent.delay,
        "at": sent.at,
        "priority": sent.priority,
    }


def sent_ids(queue: str, results: list[SendResult]) -> list[int]:
    """The job ids of a send's results, or the error its outcome means."""
    ids = []
    for result in results:
        if result.outcome == "no_queue":
            raise no_queue(queue)
        if result.outcome == "key_on_standard":
            raise key_on_standard(queue)
        assert result.job_id is not None
        ids.append(result.job_id)
    return ids


def no_queue(queue: str) -> NotFound:
    return NotFound(f"no queue named {queue!r}; declare it first")


def _start(
    now: datetime | None, start_after: datetime | timedelta | None
) -> tuple[float | None, datetime | None]:
    """A send's start as the database takes it: a delay in seconds, or a time."""
    if start_after is None:
        return None, None
    if now is not None:
        return None, due_time(now, start_after)
    if isinstance(start_after, timedelta):
        return max(start_after.total_seconds(), 0.0), None
    due_time(datetime.now(UTC), start_after)  # refuses a naive time, or what is no time
    return None, start_after


def not_a_connection(conn: object, wanted: str) -> InvalidInput:
    return InvalidInput(
        f"conn must be {wanted} in the transaction the job belongs to, not {type(conn).__name__}"
    )
