"""Property tests of the pure decisions: the one backoff's bounds, what a database error means
(the same for a run and an ingestion), and a run's fate after an attempt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import psycopg.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sync.base.abort import AbortReason
from sync.ingestions.decisions import FAILED, after_failure
from sync.jobs.outcome import Action, Backoff, database_error
from sync.runs.decide import TableResult, Waiting, decide, merged, ordinal, table_status
from sync.store.retry import RetryPolicy
from sync.vocabulary import ErrorKind, JobError, RunStatus, TableStatus

SCHEDULE = (5.0, 30.0, 120.0)
unit = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(attempt=st.integers(min_value=-3, max_value=50), r=unit)
def test_backoff_stays_within_the_jitter_window(attempt: int, r: float) -> None:
    base = SCHEDULE[min(max(attempt, 1), 3) - 1]
    delay = Backoff(SCHEDULE, jitter=0.2).delay(attempt, lambda: r)
    assert base * 0.8 <= delay <= base * 1.2


@given(
    failures=st.integers(min_value=-5, max_value=10**9),
    base=st.floats(min_value=0.001, max_value=86400.0),
    extra=st.floats(min_value=0.0, max_value=30 * 86400.0),
    r=unit,
)
def test_a_doubling_backoff_starts_at_its_base_and_never_passes_its_ceiling(
    failures: int, base: float, extra: float, r: float
) -> None:
    ceiling = base + extra
    delay = Backoff(base=base, ceiling=ceiling).delay(failures, lambda: r)
    assert 0.8 * base <= delay <= ceiling
    if failures <= 1:
        assert delay <= 1.2 * base


# Every SQLSTATE psycopg knows a class for.
SQLSTATES = sorted(
    {
        cls.sqlstate
        for cls in vars(psycopg.errors).values()
        if isinstance(cls, type) and issubclass(cls, psycopg.Error) and cls.sqlstate
    }
)


@given(
    code=st.sampled_from(SQLSTATES),
    attempts=st.integers(min_value=1, max_value=6),
    max_attempts=st.integers(min_value=1, max_value=6),
    r=unit,
)
def test_a_database_error_means_the_same_for_a_run_and_an_ingestion(
    code: str, attempts: int, max_attempts: int, r: float
) -> None:
    exc = psycopg.errors.lookup(code)("the server said no")
    error = database_error(exc)
    # Postgres refused the data (a data exception, a violated constraint): the same data is
    # refused again, so no retry; anything else is retried while attempts remain.
    refused = code[:2] in ("22", "23")
    assert error.is_retryable is not refused
    assert error.kind is (ErrorKind.RECORD if refused else ErrorKind.DATABASE)

    ingestion = after_failure(
        exc, abort=None, attempts=attempts, max_attempts=max_attempts, rand=lambda: r
    )
    run = decide({}, attempts=attempts, max_attempts=max_attempts, run_error=error, rand=lambda: r)
    assert ingestion.error is not None and ingestion.error.kind is error.kind
    if refused or attempts >= max_attempts:
        assert (ingestion.action, ingestion.status) == (Action.FINISH, FAILED)
        assert (run.action, run.status) == (Action.FINISH, RunStatus.FAILED)
    else:
        assert ingestion.action is Action.REQUEUE
        assert run.action is Action.REQUEUE and run.delay == ingestion.delay
        assert ingestion.delay == Backoff(SCHEDULE).delay(attempts, lambda: r)


def test_transient_database_errors_are_retried_and_a_check_violation_is_not() -> None:
    for transient in ("40001", "40P01", "55P03", "08006", "57P01"):
        assert database_error(psycopg.errors.lookup(transient)()).is_retryable, transient
    check = database_error(psycopg.errors.CheckViolation("new row violates check constraint"))
    assert check == JobError(
        ErrorKind.RECORD, "Postgres rejected a value: new row violates check constraint"
    )
    later = after_failure(
        psycopg.errors.CheckViolation("no"), abort=None, attempts=1, max_attempts=3
    )
    assert later.status == FAILED and later.error is not None
    assert later.error.kind is ErrorKind.RECORD


def test_retries_count_attempts_and_repeat_a_lost_connection_only_if_idempotent() -> None:
    waits: list[float] = []
    policy = RetryPolicy(attempts=3, sleep=waits.append)

    def failing(*errors: Exception) -> tuple[list[int], Callable[[], str]]:
        calls: list[int] = []

        def call() -> str:
            calls.append(1)
            if len(calls) <= len(errors):
                raise errors[len(calls) - 1]
            return "done"

        return calls, call

    deadlocks = [psycopg.errors.DeadlockDetected("deadlock detected")] * 5
    calls, call = failing(*deadlocks)
    with pytest.raises(psycopg.errors.DeadlockDetected):
        policy.run(call)
    assert len(calls) == 3 and len(waits) == 2  # three tries, a wait before each repeat

    calls, call = failing(*deadlocks[:2])
    assert policy.run(call) == "done" and len(calls) == 3

    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    calls, call = failing(lost)
    with pytest.raises(psycopg.OperationalError):
        policy.run(call)
    assert len(calls) == 1  # a claim that may have committed is never sent twice
    calls, call = failing(lost, lost, lost, lost)
    assert policy.run(call, idempotent=True) == "done" and len(calls) == 5

    refused = psycopg.errors.CheckViolation("new row violates check constraint")
    calls, call = failing(refused)
    with pytest.raises(psycopg.errors.CheckViolation):
        policy.run(call, idempotent=True)
    assert len(calls) == 1


@given(r=unit)
def test_backoff_grows_with_attempts(r: float) -> None:
    delays = [Backoff(SCHEDULE).delay(a, lambda: r) for a in (1, 2, 3)]
    assert delays == sorted(delays)


statuses = st.sampled_from(list(TableStatus))
errors = st.one_of(
    st.none(),
    st.builds(
        JobError,
        kind=st.sampled_from([ErrorKind.RETRYABLE, ErrorKind.PERMANENT, ErrorKind.RECORD]),
        message=st.text(max_size=20),
    ),
    st.builds(
        JobError,
        kind=st.just(ErrorKind.RATE_LIMITED),
        message=st.just("429"),
        retry_after=st.floats(min_value=0, max_value=86400),
    ),
)
tables = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.builds(TableResult, status=statuses, error=errors),
    max_size=6,
)


@given(
    results=tables,
    attempts=st.integers(1, 5),
    extra=st.integers(0, 3),
    abort=st.one_of(st.none(), st.sampled_from(list(AbortReason))),
)
def test_every_attempt_ends_in_exactly_one_sensible_way(
    results: dict[str, TableResult], attempts: int, extra: int, abort: AbortReason | None
) -> None:
    max_attempts = attempts + extra
    outcome = decide(
        results,
        attempts=attempts,
        max_attempts=max_attempts,
        abort=abort,
        schedule=SCHEDULE,
        rand=lambda: 0.5,
    )
    assert outcome.status is None or isinstance(outcome.status, RunStatus)
    assert outcome.error is None or isinstance(outcome.error.kind, ErrorKind)
    if abort is AbortReason.LEASE_LOST:
        assert outcome.action is Action.STOP
        return
    if abort is AbortReason.SHUTDOWN:
        assert outcome.action is Action.HAND_BACK
        return
    if abort is AbortReason.CANCELLED:
        assert (outcome.action, outcome.status) == (Action.FINISH, RunStatus.CANCELLED)
        return
    unsettled = abort is AbortReason.TIMEOUT or any(
        r.status in (TableStatus.RETRY, TableStatus.PENDING) for r in results.values()
    )
    if outcome.action is Action.REQUEUE:
        assert unsettled and attempts < max_attempts
        waits = [r.retry_after for r in results.values() if r.retry_after is not None]
        if waits:  # the provider's Retry-After always wins
            assert outcome.delay == max(waits)
        else:
            assert outcome.delay == SCHEDULE[min(attempts, 3) - 1]
        return
    assert outcome.action is Action.FINISH
    if unsettled:  # out of attempts: dead-lettered
        assert attempts >= max_attempts and outcome.status is RunStatus.FAILED
        return
    ok = [r.status is TableStatus.SUCCEEDED for r in results.values()]
    some = any(ok) or any(r.status is TableStatus.PARTIAL for r in results.values())
    expected = RunStatus.SUCCEEDED if all(ok) else RunStatus.PARTIAL if some else RunStatus.FAILED
    assert outcome.status is expected
    first = next(((name, r.error) for name, r in results.items() if r.error), None)
    if first is None:
        assert outcome.error is None
    elif expected is not RunStatus.SUCCEEDED:
        assert outcome.error == replace(first[1], table=first[0])


def test_a_permanent_run_error_fails_at_once_even_with_attempts_left() -> None:
    outcome = decide(
        {"items": TableResult(TableStatus.PENDING)},
        attempts=1,
        max_attempts=3,
        run_error=JobError(ErrorKind.AUTH, "401"),
    )
    assert (outcome.action, outcome.status) == (Action.FINISH, RunStatus.FAILED)
    assert outcome.error == JobError(ErrorKind.AUTH, "401")


def test_a_retryable_run_error_is_retried() -> None:
    outcome = decide(
        {},
        attempts=1,
        max_attempts=3,
        run_error=JobError(ErrorKind.INTERNAL, "boom"),
        rand=lambda: 0.5,
    )
    assert outcome.action is Action.REQUEUE and outcome.delay == 5.0


START = datetime(2024, 5, 6, 10, 0, tzinfo=UTC)


def rate_limited(retry_after: float | None) -> TableResult:
    return TableResult(
        TableStatus.RETRY,
        error=JobError(ErrorKind.RATE_LIMITED, "429", retry_after=retry_after),
    )


@given(
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=20 * 3600)),
    elapsed=st.floats(min_value=0, max_value=30 * 3600),
    waits=st.integers(0, 50),
    attempts=st.integers(1, 3),
)
def test_a_rate_limit_waits_without_spending_an_attempt_until_the_deadline(
    retry_after: float | None, elapsed: float, waits: int, attempts: int
) -> None:
    now = START + timedelta(seconds=elapsed)
    outcome = decide(
        {"issues": rate_limited(retry_after), "pulls": TableResult(TableStatus.PENDING)},
        attempts=attempts,
        max_attempts=3,
        schedule=SCHEDULE,
        rand=lambda: 0.5,
        waiting=Waiting("the github rate limit", START, waits, now, timedelta(hours=24)),
    )
    delay = retry_after if retry_after is not None else SCHEDULE[min(waits + 1, 3) - 1]
    if now + timedelta(seconds=delay) > START + timedelta(hours=24):
        assert (outcome.action, outcome.status) == (Action.FINISH, RunStatus.FAILED)
        assert outcome.error is not None and outcome.error.kind is ErrorKind.DEADLINE
        assert "the github rate limit" in outcome.error.message
        assert f"{ordinal(waits + 1)} wait" in outcome.error.message
        assert "run_deadline" in outcome.error.message
    else:
        # Whatever attempts are left: a wait is not a failure.
        assert outcome.action is Action.WAIT and outcome.delay == delay
        assert outcome.waiting_for == "the github rate limit"


def test_a_failure_beside_a_rate_limit_spends_an_attempt() -> None:
    outcome = decide(
        {
            "issues": rate_limited(600),
            "pulls": TableResult(TableStatus.RETRY, error=JobError(ErrorKind.RETRYABLE, "502")),
        },
        attempts=1,
        max_attempts=3,
        waiting=Waiting("the github rate limit", START, 0, START, timedelta(hours=24)),
    )
    assert outcome.action is Action.REQUEUE and outcome.delay == 600


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip


counts = st.integers(0, 1000)
results = st.builds(
    TableResult, status=statuses, upserted=counts, unchanged=counts, tombstoned=counts
)


@given(first=results, second=results)
def test_run_totals_add_up_every_attempt_and_keep_the_latest_status(
    first: TableResult, second: TableResult
) -> None:
    total = merged(merged(None, first), second)
    assert total.upserted == first.upserted + second.upserted
    assert total.unchanged == first.unchanged + second.unchanged
    assert total.tombstoned == first.tombstoned + second.tombstoned
    assert total.status is second.status


@given(parts=st.dictionaries(st.text(min_size=1, max_size=4), statuses, min_size=1, max_size=5))
def test_a_partitioned_tables_status(parts: dict[str, TableStatus]) -> None:
    status = table_status({name: TableResult(s) for name, s in parts.items()})
    values = set(parts.values())
    if values & {TableStatus.CANCELLED, TableStatus.RETRY, TableStatus.PENDING}:
        assert status in (TableStatus.CANCELLED, TableStatus.RETRY, TableStatus.PENDING)
    elif values == {TableStatus.SUCCEEDED}:
        assert status is TableStatus.SUCCEEDED
    elif values & {TableStatus.SUCCEEDED, TableStatus.PARTIAL}:
        assert status is TableStatus.PARTIAL  # one failing partition fails only its slice
    else:
        assert status is TableStatus.FAILED


@given(results=tables)
def test_results_read_back_as_they_were_stored(results: dict[str, TableResult]) -> None:
    for result in results.values():
        again = TableResult.from_json(result.to_json())
        assert again == result
        assert again.error is None or isinstance(again.error.kind, ErrorKind)
