"""Property tests of the application queues' pure decisions: the retry delay, a job's fate after
an attempt, cron ticks and firings, who an exclusive queue admits, and when a job is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from sync.jobs.outcome import DEFAULT_JITTER as JITTER
from sync.jobs.outcome import Action, Backoff
from sync.queues.admission import WHOLE_QUEUE, due_time, singleton_slot
from sync.queues.cron import firing, latest_tick, next_tick, parse_cron
from sync.queues.declarations import QueueSpec
from sync.queues.models import AttemptOutcome, JobStatus, QueuePolicy
from sync.queues.retries import COMPLETE, DEAD, fate_after

unit = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
seconds = st.floats(min_value=0.001, max_value=86400.0)


@st.composite
def delays(draw: st.DrawFn) -> tuple[float, float]:
    base = draw(seconds)
    return base, draw(st.floats(min_value=base, max_value=30 * 86400.0))


# Retry delays: the one backoff, doubling from a queue's retry_delay up to its ceiling


@given(failures=st.integers(min_value=-5, max_value=10**9), bounds=delays(), r=unit)
def test_a_retry_delay_is_positive_and_never_past_the_ceiling(
    failures: int, bounds: tuple[float, float], r: float
) -> None:
    base, ceiling = bounds
    delay = Backoff(base=base, ceiling=ceiling).delay(failures, lambda: r)
    assert (1 - JITTER) * base <= delay <= ceiling


@given(failures=st.integers(min_value=1, max_value=60), bounds=delays(), r=unit)
def test_a_retry_delay_doubles_until_it_reaches_the_ceiling(
    failures: int, bounds: tuple[float, float], r: float
) -> None:
    base, ceiling = bounds
    this = Backoff(base=base, ceiling=ceiling).delay(failures, lambda: r)
    after = Backoff(base=base, ceiling=ceiling).delay(failures + 1, lambda: r)
    doubled = base * 2.0 ** (failures - 1)
    if doubled * 2 * (1 + JITTER) <= ceiling:  # both below the ceiling: exactly twice
        assert after == pytest.approx(2 * this)
        assert (1 - JITTER) * doubled <= this <= (1 + JITTER) * doubled * (1 + 1e-12)
    else:
        assert this <= after <= ceiling


@given(failures=st.integers(min_value=1, max_value=10**9), bounds=delays(), r=unit)
def test_past_the_ceiling_a_delay_is_the_ceiling_less_its_jitter(
    failures: int, bounds: tuple[float, float], r: float
) -> None:
    base, ceiling = bounds
    if failures <= 64 and base * 2.0 ** (failures - 1) < ceiling:
        return
    delay = Backoff(base=base, ceiling=ceiling).delay(failures, lambda: r)
    assert (1 - JITTER) * ceiling <= delay <= ceiling


def test_jitter_spreads_delays_that_would_be_equal() -> None:
    spread = {Backoff(base=5, ceiling=600).delay(3, lambda r=r: r) for r in (0.0, 0.5, 0.99)}
    assert sorted(spread) == pytest.approx([16.0, 20.0, 23.92])


# A job's fate after an attempt


queues = st.builds(
    lambda limit, bounds: QueueSpec(
        name="q", retry_limit=limit, retry_delay=bounds[0], retry_ceiling=bounds[1]
    ),
    st.integers(min_value=0, max_value=50),
    delays(),
)


@given(queue=queues, attempts=st.integers(min_value=1, max_value=100), r=unit)
def test_a_completed_attempt_completes_the_job(queue: QueueSpec, attempts: int, r: float) -> None:
    decision = fate_after(AttemptOutcome.COMPLETED, attempts=attempts, queue=queue, rand=lambda: r)
    assert decision == COMPLETE
    assert (decision.action, decision.status) == (Action.FINISH, JobStatus.COMPLETED)


@given(queue=queues, attempts=st.integers(min_value=1, max_value=100), r=unit)
def test_a_failed_attempt_is_retried_until_the_limit_then_dead_lettered(
    queue: QueueSpec, attempts: int, r: float
) -> None:
    decision = fate_after(AttemptOutcome.FAILED, attempts=attempts, queue=queue, rand=lambda: r)
    if attempts <= queue.retry_limit:
        assert decision.action is Action.REQUEUE
        expected = Backoff(base=queue.retry_delay, ceiling=queue.retry_ceiling).delay(
            attempts, lambda: r
        )
        assert decision.delay == expected
    else:
        assert decision == DEAD
        assert (decision.action, decision.status) == (Action.FINISH, JobStatus.DEAD)


@given(queue=queues, attempts=st.integers(min_value=1, max_value=100))
def test_an_expired_attempt_is_retried_at_once_until_the_limit(
    queue: QueueSpec, attempts: int
) -> None:
    decision = fate_after(AttemptOutcome.EXPIRED, attempts=attempts, queue=queue)
    if attempts <= queue.retry_limit:
        assert (decision.action, decision.delay) == (Action.REQUEUE, 0.0)
    else:
        assert decision == DEAD


@given(queue=queues, outcomes=st.lists(st.sampled_from(["failed", "expired"]), min_size=200))
def test_a_job_that_always_fails_gets_exactly_its_attempts(
    queue: QueueSpec, outcomes: list[str]
) -> None:
    attempts = 0
    for outcome in outcomes:
        attempts += 1
        if fate_after(AttemptOutcome(outcome), attempts=attempts, queue=queue) == DEAD:
            break
    assert attempts == queue.retry_limit + 1


def test_a_cancelled_attempt_has_no_fate_to_decide() -> None:
    with pytest.raises(ValueError):
        fate_after(AttemptOutcome.CANCELLED, attempts=1, queue=QueueSpec(name="q"))


# Cron


@st.composite
def crons(draw: st.DrawFn) -> str:
    minute = draw(
        st.one_of(
            st.just("*"),
            st.integers(1, 30).map(lambda k: f"*/{k}"),
            st.integers(0, 59).map(str),
            st.lists(st.integers(0, 59), min_size=2, max_size=4, unique=True).map(
                lambda ms: ",".join(map(str, sorted(ms)))
            ),
        )
    )
    hour = draw(st.one_of(st.just("*"), st.integers(0, 23).map(str), st.just("9-17")))
    day = draw(st.one_of(st.just("*"), st.integers(1, 28).map(str)))
    weekday = draw(st.one_of(st.just("*"), st.integers(0, 6).map(str), st.just("1-5")))
    return f"{minute} {hour} {day} * {weekday}"


moments = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=60)
@given(expression=crons(), now=moments)
def test_next_and_latest_ticks_bracket_now_with_no_tick_between(
    expression: str, now: datetime
) -> None:
    after, before = next_tick(expression, now), latest_tick(expression, now)
    assert before <= now < after
    assert croniter.match(expression, before) and croniter.match(expression, after)
    assert before.second == before.microsecond == 0 and before.tzinfo is not None
    assert next_tick(expression, before) == after  # nothing in (before, after)


@settings(max_examples=60)
@given(expression=crons(), start=moments, data=st.data())
def test_a_schedule_fires_each_tick_once_and_never_a_backlog(
    expression: str, start: datetime, data: st.DataObject
) -> None:
    gaps = data.draw(
        st.lists(st.integers(min_value=0, max_value=10 * 86400), min_size=1, max_size=30)
    )
    pending, now, fired = next_tick(expression, start), start, []
    for gap in gaps:
        now += timedelta(seconds=gap)
        fire = firing(expression, pending, now)
        if now < pending:
            assert fire.tick is None and fire.next_tick == pending
        else:
            assert fire.tick is not None
            assert pending <= fire.tick <= now < fire.next_tick
            assert latest_tick(expression, now) == fire.tick  # the latest missed tick only
            fired.append(fire.tick)
        again = firing(expression, fire.next_tick, now)  # a second worker, same moment
        assert again.tick is None
        pending = fire.next_tick
    assert fired == sorted(set(fired))  # each tick once, in order
    assert len(fired) <= len(gaps)  # at most one per firing: no backlog


@settings(max_examples=30)
@given(expression=crons(), start=moments)
def test_a_schedule_polled_at_every_tick_fires_every_tick(expression: str, start: datetime) -> None:
    ticks = [next_tick(expression, start)]
    while len(ticks) < 10:
        ticks.append(next_tick(expression, ticks[-1]))
    pending, fired = ticks[0], []
    for tick in ticks:
        fire = firing(expression, pending, tick + timedelta(seconds=30))
        assert fire.tick is not None
        fired.append(fire.tick)
        pending = fire.next_tick
    assert fired == ticks


def test_an_outage_of_six_ticks_fires_once_for_the_latest() -> None:
    pending = datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    fire = firing("*/5 * * * *", pending, datetime(2030, 1, 1, 0, 32, tzinfo=UTC))
    assert fire.tick == datetime(2030, 1, 1, 0, 30, tzinfo=UTC)
    assert fire.next_tick == datetime(2030, 1, 1, 0, 35, tzinfo=UTC)


def test_cron_times_are_utc_whatever_zone_now_is_given_in() -> None:
    east = datetime(2030, 1, 1, 9, 7, tzinfo=UTC).astimezone(timezone(timedelta(hours=5)))
    assert next_tick("0 10 * * *", east) == datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    with pytest.raises(ValueError):
        next_tick("* * * * *", datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("given", "stored"),
    [("*/5  *  * * *", "*/5 * * * *"), ("@HOURLY", "@hourly"), ("0 9 * * 1-5", "0 9 * * 1-5")],
)
def test_a_cron_expression_is_stored_normalized(given: str, stored: str) -> None:
    assert parse_cron(given) == stored


# Admission and due times


@given(key=st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_exclusive_queues_hold_a_slot_per_key_and_standard_ones_none(key: str | None) -> None:
    exclusive = QueueSpec(name="q", policy=QueuePolicy.EXCLUSIVE)
    assert singleton_slot(QueueSpec(name="q"), key) is None
    assert singleton_slot(exclusive, key) == (WHOLE_QUEUE if key is None else key)


@given(now=moments, delay=st.timedeltas(min_value=timedelta(days=-30), max_value=timedelta(30)))
def test_a_job_is_never_due_before_it_is_sent(now: datetime, delay: timedelta) -> None:
    assert due_time(now, delay) == now + max(delay, timedelta(0))
    assert due_time(now, now + delay) == max(now, now + delay)
    assert due_time(now, None) == now
