"""Pure decisions about a run's fate: the backoff before the next attempt and what an attempt's
per-table results mean for the run. No I/O here; the executor applies what these return."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

DEFAULT_BACKOFF: tuple[float, ...] = (5.0, 30.0, 120.0)
DEFAULT_JITTER = 0.2


class TableStatus(StrEnum):
    PENDING = "pending"  # not read yet in any attempt
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a permanent failure: no retry will help
    RETRY = "retry"  # a retryable failure: the next attempt reads it again
    CANCELLED = "cancelled"


class AbortReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


@dataclass
class TableResult:
    status: TableStatus = TableStatus.PENDING
    upserted: int = 0
    unchanged: int = 0
    tombstoned: int = 0
    error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "upserted": self.upserted,
            "unchanged": self.unchanged,
            "tombstoned": self.tombstoned,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableResult:
        return cls(
            status=TableStatus(data.get("status", "pending")),
            upserted=int(data.get("upserted", 0)),
            unchanged=int(data.get("unchanged", 0)),
            tombstoned=int(data.get("tombstoned", 0)),
            error=data.get("error"),
        )

    @property
    def retry_after(self) -> float | None:
        value = (self.error or {}).get("retry_after")
        return float(value) if value is not None else None


def backoff_delay(
    attempt: int,
    schedule: Sequence[float] = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based): the schedule's entry
    (the last one past its end) times a random factor in [1 - jitter, 1 + jitter]."""
    base = schedule[min(max(attempt, 1), len(schedule)) - 1]
    return base * (1 - jitter + 2 * jitter * rand())


class Action(StrEnum):
    FINISH = "finish"  # seal the run with `status`
    REQUEUE = "requeue"  # same row back to queued, due after `delay`
    HAND_BACK = "hand_back"  # shutdown: back to the queue now, attempt not spent
    STOP = "stop"  # the lease is lost: write nothing more


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str | None = None
    delay: float | None = None
    error: dict[str, Any] | None = field(default=None)


def decide(
    results: Mapping[str, TableResult],
    *,
    attempts: int,
    max_attempts: int,
    abort: AbortReason | None = None,
    run_error: dict[str, Any] | None = None,
    schedule: Sequence[float] = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """What to do with a run after an attempt.

    ``run_error`` is a failure of the attempt as a whole (the connector could not start, an
    unexpected error outside any table) with the same ``kind`` vocabulary as table errors.
    """
    if abort is AbortReason.LEASE_LOST:
        return Outcome(Action.STOP)
    if abort is AbortReason.SHUTDOWN:
        return Outcome(Action.HAND_BACK)
    if abort is AbortReason.CANCELLED:
        return Outcome(
            Action.FINISH,
            "cancelled",
            error={"kind": "cancelled", "message": "a cancel was requested"},
        )

    errors: list[tuple[str | None, dict[str, Any] | None]] = [
        (name, r.error) for name, r in results.items() if r.error
    ]
    if run_error is not None:
        errors.insert(0, (None, run_error))
    first_error = _describe(errors[0]) if errors else None

    if run_error is not None and run_error.get("kind") not in RETRYABLE_KINDS:
        # The attempt as a whole cannot succeed (bad config, refused credentials).
        return Outcome(Action.FINISH, "failed", error=first_error)

    if abort is AbortReason.TIMEOUT:
        first_error = {"kind": "timeout", "message": "the run exceeded its timeout"}
    wants_retry = (
        abort is AbortReason.TIMEOUT
        or run_error is not None
        or any(r.status in (TableStatus.RETRY, TableStatus.PENDING) for r in results.values())
    )
    if wants_retry:
        if attempts < max_attempts:
            waits = [r.retry_after for r in results.values() if r.retry_after is not None]
            if run_error is not None and run_error.get("retry_after") is not None:
                waits.append(float(run_error["retry_after"]))
            delay = max(waits) if waits else backoff_delay(attempts, schedule, jitter, rand)
            return Outcome(Action.REQUEUE, delay=delay, error=first_error)
        message = f"gave up after {attempts} attempt(s)"
        if first_error:
            message += f": {first_error.get('message', '')}"
        return Outcome(Action.FINISH, "failed", error={**(first_error or {}), "message": message})

    failed = sum(r.status is not TableStatus.SUCCEEDED for r in results.values())
    if failed == 0:
        return Outcome(Action.FINISH, "succeeded")
    if failed == len(results):
        return Outcome(Action.FINISH, "failed", error=first_error)
    return Outcome(Action.FINISH, "partial", error=first_error)


# Error kinds a later attempt may fix.
RETRYABLE_KINDS = frozenset({"retryable", "rate_limited", "database", "internal", "timeout"})


def _describe(item: tuple[str | None, dict[str, Any] | None]) -> dict[str, Any]:
    table, error = item
    described = dict(error or {})
    if table is not None:
        described["table"] = table
    return described
