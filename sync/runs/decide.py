"""The pure decisions of a run: what an attempt's per-table results mean for the run (finish,
requeue, wait for a rate limit, hand back, stop), and how per-table results add up over the
attempts of one run. No I/O here; the run kind applies what these return."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from sync.base.abort import AbortReason
from sync.jobs.outcome import DEFAULT_BACKOFF, DEFAULT_JITTER, Action, Backoff, Outcome
from sync.vocabulary import ErrorKind, JobError, RunStatus, TableStatus


@dataclass
class TableResult:
    """What happened to a table (or one partition of it): in one attempt, or in the whole run
    (the sum of its attempts, see :func:`merged`). Never one "written" number: rows upserted
    (new, changed or revived), rows seen unchanged, rows tombstoned."""

    status: TableStatus = TableStatus.PENDING
    upserted: int = 0
    unchanged: int = 0
    tombstoned: int = 0
    error: JobError | None = None
    total: int | None = None  # as many records as the provider said there are
    partitions: dict[str, TableResult] | None = None
    total_estimated: bool = False  # the total adds up an estimate (of a slice not read whole)
    # What readers should know: a typed column widened because its values no longer fit.
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status.value,
            "upserted": self.upserted,
            "unchanged": self.unchanged,
            "tombstoned": self.tombstoned,
            "error": self.error.to_json() if self.error else None,
        }
        if self.total is not None:
            out["total"] = self.total
            if self.total_estimated:
                out["total_estimated"] = True
        if self.partitions is not None:
            out["partitions"] = {name: p.to_json() for name, p in self.partitions.items()}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableResult:
        partitions = data.get("partitions")
        return cls(
            status=TableStatus(data.get("status", "pending")),
            upserted=int(data.get("upserted", 0)),
            unchanged=int(data.get("unchanged", 0)),
            tombstoned=int(data.get("tombstoned", 0)),
            error=JobError.parse(data.get("error")),
            total=data.get("total"),
            total_estimated=bool(data.get("total_estimated", False)),
            warnings=tuple(data.get("warnings") or ()),
            partitions=(
                {name: cls.from_json(p) for name, p in partitions.items()}
                if isinstance(partitions, Mapping)
                else None
            ),
        )

    @property
    def retry_after(self) -> float | None:
        return self.error.retry_after if self.error else None


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
        total_estimated=(
            attempt.total_estimated if attempt.total is not None else before.total_estimated
        ),
        warnings=tuple(dict.fromkeys((*before.warnings, *attempt.warnings))),
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


@dataclass
class AttemptReport:
    """What an attempt of a run gave, for the run's decision and its writes: the run's results
    (the totals of every attempt), this attempt's own, the records a purge has deleted, why the
    attempt stopped early, and what failed it as a whole (the connector could not start, its
    credentials were refused, the database failed outside any table)."""

    results: dict[str, TableResult]
    own: dict[str, TableResult] = field(default_factory=dict)
    processed: int | None = None
    abort: AbortReason | None = None
    error: JobError | None = None
    seen_keys_left: bool = False  # some table left the keys it saw behind
    waits_slept: list[float] = field(default_factory=list)  # rate-limit waits slept inside it


@dataclass(frozen=True)
class Waiting:
    """What deciding a wait needs to know of the run: what its rate limit is called, when it
    first started, how often it has waited, and the time now (injectable, for tests)."""

    waiting_for: str  # "the github rate limit"
    started_at: datetime
    waits: int
    now: datetime
    deadline: timedelta  # Settings.run_deadline


class Decider(Protocol):
    """:func:`decide` bound to one run: its attempts, its settings and its waits."""

    def __call__(
        self,
        results: dict[str, TableResult],
        *,
        abort: AbortReason | None = None,
        run_error: JobError | None = None,
    ) -> Outcome: ...


def decide(
    results: Mapping[str, TableResult],
    *,
    attempts: int,
    max_attempts: int,
    abort: AbortReason | None = None,
    run_error: JobError | None = None,
    schedule: Sequence[float] = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
    waiting: Waiting | None = None,
) -> Outcome:
    """What to do with a run after an attempt.

    ``run_error`` is a failure of the attempt as a whole (the connector could not start, an
    unexpected error outside any table), of the same kinds as table errors.
    With ``waiting``, an attempt that ended only because of a provider's rate limit is not a
    failure: the run waits for the reset without spending an attempt, unless that would take it
    past its deadline.
    """
    if abort is AbortReason.LEASE_LOST:
        return Outcome(Action.STOP)
    if abort is AbortReason.SHUTDOWN:
        return Outcome(Action.HAND_BACK)
    if abort is AbortReason.CANCELLED:
        why = run_error if run_error and run_error.kind is ErrorKind.CANCELLED else None
        return Outcome(
            Action.FINISH,
            RunStatus.CANCELLED,
            error=why or JobError(ErrorKind.CANCELLED, "a cancel was requested"),
        )

    errors = [replace(r.error, table=name) for name, r in results.items() if r.error]
    if run_error is not None:
        errors.insert(0, run_error)
    first_error = errors[0] if errors else None

    if run_error is not None and not run_error.is_retryable:
        # The attempt as a whole cannot succeed (bad config, refused credentials).
        return Outcome(Action.FINISH, RunStatus.FAILED, error=first_error)

    if abort is AbortReason.TIMEOUT:
        first_error = JobError(ErrorKind.TIMEOUT, "the run exceeded its timeout")
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
        waits = _retry_afters(results, run_error)
        delay = (
            max(waits) if waits else Backoff(schedule, jitter=jitter).delay(waiting.waits + 1, rand)
        )
        resumes = waiting.now + timedelta(seconds=delay)
        if resumes > waiting.started_at + waiting.deadline:
            return Outcome(
                Action.FINISH,
                RunStatus.FAILED,
                error=_past_deadline(waiting, resumes, first_error),
            )
        return Outcome(Action.WAIT, delay=delay, error=first_error, waiting_for=waiting.waiting_for)
    if wants_retry:
        if attempts < max_attempts:
            waits = _retry_afters(results, run_error)
            delay = max(waits) if waits else Backoff(schedule, jitter=jitter).delay(attempts, rand)
            return Outcome(Action.REQUEUE, delay=delay, error=first_error)
        message = f"gave up after {attempts} attempt(s)"
        if first_error:
            message += f": {first_error.message}"
        gave_up = (
            first_error.with_message(message) if first_error else JobError(ErrorKind.ERROR, message)
        )
        return Outcome(Action.FINISH, RunStatus.FAILED, error=gave_up)

    unsucceeded = [r.status for r in results.values() if r.status is not TableStatus.SUCCEEDED]
    if not unsucceeded:
        return Outcome(Action.FINISH, RunStatus.SUCCEEDED)
    if len(unsucceeded) == len(results) and TableStatus.PARTIAL not in unsucceeded:
        return Outcome(Action.FINISH, RunStatus.FAILED, error=first_error)
    return Outcome(Action.FINISH, RunStatus.PARTIAL, error=first_error)


def _retry_afters(results: Mapping[str, TableResult], run_error: JobError | None) -> list[float]:
    """The waits the provider asked for, in the tables' errors and the attempt's."""
    waits = [r.retry_after for r in results.values() if r.retry_after is not None]
    if run_error is not None and run_error.retry_after is not None:
        waits.append(run_error.retry_after)
    return waits


def _only_rate_limited(results: Mapping[str, TableResult], run_error: JobError | None) -> bool:
    """The attempt wants a retry only because a provider's budget is spent: some table stopped
    on a rate limit, and every other table that is not settled is waiting its turn."""
    if run_error is not None and run_error.kind is not ErrorKind.RATE_LIMITED:
        return False
    limited = run_error is not None
    for r in results.values():
        if r.status is TableStatus.RETRY:
            if r.error is None or r.error.kind is not ErrorKind.RATE_LIMITED:
                return False
            limited = True
    return limited


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th... (for "the 3rd wait")."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _past_deadline(waiting: Waiting, resumes: datetime, cause: JobError | None) -> JobError:
    hours = waiting.deadline.total_seconds() / 3600
    message = (
        f"gave up waiting for {waiting.waiting_for}: the run started at "
        f"{waiting.started_at:%Y-%m-%d %H:%M} UTC and its {ordinal(waiting.waits + 1)} wait "
        f"would last until {resumes:%Y-%m-%d %H:%M} UTC, past its deadline of {hours:g} h "
        "(the run_deadline setting); retry the run when the provider's limit allows"
    )
    if cause is None:
        return JobError(ErrorKind.DEADLINE, message)
    return replace(cause, kind=ErrorKind.DEADLINE, message=message)
