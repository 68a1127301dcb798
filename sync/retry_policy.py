"""Pure decisions about a run's fate: the backoff before the next attempt and what an attempt's
per-table results mean for the run. No I/O here; the executor applies what these return."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
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
    PARTIAL = "partial"  # some partitions failed for good, the others were read


# A table in one of these is not read again by a later attempt of the run.
SETTLED = frozenset({TableStatus.SUCCEEDED, TableStatus.FAILED, TableStatus.PARTIAL})


class AbortReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


@dataclass
class TableResult:
    """What happened to a table (or one partition of it): in one attempt, or in the whole run
    (the sum of its attempts, see :func:`merged`). Never one "written" number: rows upserted
    (new, changed or revived), rows seen unchanged, rows tombstoned."""

    status: TableStatus = TableStatus.PENDING
    upserted: int = 0
    unchanged: int = 0
    tombstoned: int = 0
    error: dict[str, Any] | None = None
    total: int | None = None  # as many records as the provider said there are
    partitions: dict[str, TableResult] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status.value,
            "upserted": self.upserted,
            "unchanged": self.unchanged,
            "tombstoned": self.tombstoned,
            "error": self.error,
        }
        if self.total is not None:
            out["total"] = self.total
        if self.partitions is not None:
            out["partitions"] = {name: p.to_json() for name, p in self.partitions.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableResult:
        partitions = data.get("partitions")
        return cls(
            status=TableStatus(data.get("status", "pending")),
            upserted=int(data.get("upserted", 0)),
            unchanged=int(data.get("unchanged", 0)),
            tombstoned=int(data.get("tombstoned", 0)),
            error=data.get("error"),
            total=data.get("total"),
            partitions=(
                {name: cls.from_json(p) for name, p in partitions.items()}
                if isinstance(partitions, Mapping)
                else None
            ),
        )

    @property
    def retry_after(self) -> float | None:
        value = (self.error or {}).get("retry_after")
        return float(value) if value is not None else None


def merged(before: TableResult | None, attempt: TableResult) -> TableResult:
    """A table's result for the run after an attempt: the counts of every attempt added up;
    status, error and total as the latest attempt left them (pure)."""
    if before is None:
        parts = attempt.partitions
        return replace(attempt, partitions=dict(parts) if parts is not None else None)
    partitions = None
    if before.partitions is not None or attempt.partitions is not None:
        partitions = dict(before.partitions or {})
        for name, result in (attempt.partitions or {}).items():
            partitions[name] = merged(partitions.get(name), result)
    return TableResult(
        status=attempt.status,
        upserted=before.upserted + attempt.upserted,
        unchanged=before.unchanged + attempt.unchanged,
        tombstoned=before.tombstoned + attempt.tombstoned,
        error=attempt.error,
        total=attempt.total if attempt.total is not None else before.total,
        partitions=partitions,
    )


def table_status(parts: Mapping[str, TableResult]) -> TableStatus:
    """A partitioned table's status from its partitions' (pure): any that a later attempt may
    fix makes the whole table wait for it; otherwise partial when some failed for good."""
    statuses = {p.status for p in parts.values()}
    for waiting in (TableStatus.CANCELLED, TableStatus.RETRY, TableStatus.PENDING):
        if waiting in statuses:
            return waiting
    if statuses <= {TableStatus.SUCCEEDED}:
        return TableStatus.SUCCEEDED
    if TableStatus.SUCCEEDED in statuses or TableStatus.PARTIAL in statuses:
        return TableStatus.PARTIAL
    return TableStatus.FAILED


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
    WAIT = "wait"  # a rate limit: back to the queue until the reset, attempt not spent
    STOP = "stop"  # the lease is lost: write nothing more


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str | None = None
    delay: float | None = None
    error: dict[str, Any] | None = field(default=None)
    waiting_for: str | None = None  # Action.WAIT: what the run waits for


@dataclass(frozen=True)
class Waiting:
    """What deciding a wait needs to know of the run: what its rate limit is called, when it
    first started, how often it has waited, and the time now (injectable, for tests)."""

    waiting_for: str  # "the github rate limit"
    started_at: datetime
    waits: int
    now: datetime
    deadline: timedelta  # Settings.run_deadline


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
    waiting: Waiting | None = None,
) -> Outcome:
    """What to do with a run after an attempt.

    ``run_error`` is a failure of the attempt as a whole (the connector could not start, an
    unexpected error outside any table) with the same ``kind`` vocabulary as table errors.
    With ``waiting``, an attempt that ended only because of a provider's rate limit is not a
    failure: the run waits for the reset without spending an attempt, unless that would take it
    past its deadline.
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
    if (
        wants_retry
        and waiting is not None
        and abort is None
        and _only_rate_limited(results, run_error)
    ):
        waits = [r.retry_after for r in results.values() if r.retry_after is not None]
        if run_error is not None and run_error.get("retry_after") is not None:
            waits.append(float(run_error["retry_after"]))
        delay = max(waits) if waits else backoff_delay(waiting.waits + 1, schedule, jitter, rand)
        resumes = waiting.now + timedelta(seconds=delay)
        if resumes > waiting.started_at + waiting.deadline:
            return Outcome(
                Action.FINISH, "failed", error=_past_deadline(waiting, resumes, first_error)
            )
        return Outcome(Action.WAIT, delay=delay, error=first_error, waiting_for=waiting.waiting_for)
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

    unsucceeded = [r.status for r in results.values() if r.status is not TableStatus.SUCCEEDED]
    if not unsucceeded:
        return Outcome(Action.FINISH, "succeeded")
    if len(unsucceeded) == len(results) and TableStatus.PARTIAL not in unsucceeded:
        return Outcome(Action.FINISH, "failed", error=first_error)
    return Outcome(Action.FINISH, "partial", error=first_error)


def _only_rate_limited(
    results: Mapping[str, TableResult], run_error: dict[str, Any] | None
) -> bool:
    """The attempt wants a retry only because a provider's budget is spent: some table stopped
    on a rate limit, and every other table that is not settled is waiting its turn."""
    if run_error is not None and run_error.get("kind") != "rate_limited":
        return False
    limited = run_error is not None
    for r in results.values():
        if r.status is TableStatus.RETRY:
            if (r.error or {}).get("kind") != "rate_limited":
                return False
            limited = True
    return limited


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th... (for "the 3rd wait")."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _past_deadline(
    waiting: Waiting, resumes: datetime, cause: dict[str, Any] | None
) -> dict[str, Any]:
    hours = waiting.deadline.total_seconds() / 3600
    message = (
        f"gave up waiting for {waiting.waiting_for}: the run started at "
        f"{waiting.started_at:%Y-%m-%d %H:%M} UTC and its {ordinal(waiting.waits + 1)} wait "
        f"would last until {resumes:%Y-%m-%d %H:%M} UTC, past its deadline of {hours:g} h "
        "(the run_deadline setting); retry the run when the provider's limit allows"
    )
    return {**(cause or {}), "kind": "deadline", "message": message}


# Error kinds a later attempt may fix.
RETRYABLE_KINDS = frozenset({"retryable", "rate_limited", "database", "internal", "timeout"})


def _describe(item: tuple[str | None, dict[str, Any] | None]) -> dict[str, Any]:
    table, error = item
    described = dict(error or {})
    if table is not None:
        described["table"] = table
    return described
