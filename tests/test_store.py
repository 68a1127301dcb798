"""The typed store of the runs path: the one retry decision (what is repeated, and what never
is), typed rows through a run's life against the real Postgres, and the injectable clock the
engine's own decisions are taken at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from sync import Engine
from sync.retry_policy import Action, TableResult
from sync.runs.outcome import decider
from sync.store import (
    ClaimedRun,
    ClaimTerms,
    ManualClock,
    RetryPolicy,
    RunStore,
    Seal,
    is_connection_lost,
    is_transient,
)
from tests.test_sync_flow import items, new_dataset

FAST = RetryPolicy(attempts=3, within=0.5)


class Flaky:
    """A call that fails with ``errors`` in turn, then answers."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_a_transient_failure_is_repeated_for_any_statement() -> None:
    for idempotent in (False, True):
        flaky = Flaky(psycopg.errors.SerializationFailure(), psycopg.errors.DeadlockDetected())
        assert FAST.run(flaky, idempotent=idempotent) == "done"
        assert flaky.calls == 3


def test_a_lost_connection_is_repeated_only_for_an_idempotent_statement() -> None:
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert is_connection_lost(lost) and not is_transient(lost)
    flaky = Flaky(lost)
    assert FAST.run(flaky, idempotent=True) == "done"
    # A claim is not idempotent: the first may have committed, a second would strand it.
    claim = Flaky(lost)
    with pytest.raises(psycopg.OperationalError):
        FAST.run(claim, idempotent=False)
    assert claim.calls == 1


def test_transient_repeats_are_bounded_and_other_errors_are_not_repeated() -> None:
    always = Flaky(*[psycopg.errors.LockNotAvailable() for _ in range(10)])
    with pytest.raises(psycopg.errors.LockNotAvailable):
        FAST.run(always)
    assert always.calls == FAST.attempts
    bad = Flaky(psycopg.errors.UniqueViolation())
    with pytest.raises(psycopg.errors.UniqueViolation):
        FAST.run(bad, idempotent=True)
    assert bad.calls == 1


def _claim(store: RunStore) -> ClaimedRun:
    claimed = store.claim(ClaimTerms("store-test", 60, ["memory"]))
    assert claimed is not None
    return claimed


def test_a_run_through_the_store_in_typed_rows(engine: Engine, admin: Any) -> None:
    key, _ = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    store = RunStore(engine.pool)
    queued = store.enqueue(conn.id, None, "manual", 3)
    assert queued is not None and queued.status == "queued"
    assert store.enqueue(conn.id, None, "manual", 3) == queued  # the one already queued

    run = _claim(store)
    assert (run.id, run.kind, run.attempts, run.connection_name) == (queued.id, "sync", 1, "mem")
    assert store.claim(ClaimTerms("store-test", 60, ["memory"])) is None  # its lane is taken
    assert store.save_results(run.lease, {"items": {"status": "pending"}}, {})

    results = {"items": TableResult().to_json()}
    seal = Seal(run.lease, "succeeded", results, results, None)
    assert store.finish(seal)
    assert not store.finish(seal)  # fenced: the lease ended with the finish
    done = store.get_run(run.id, None)
    assert done is not None and done.status == "succeeded" and done.lease_owner is None
    assert [a.outcome for a in store.attempts(run.id, None)] == ["succeeded"]


def test_finish_and_claim_seals_and_takes_the_next_run(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    first = engine.create_connection(ws.id, "a", "memory", config={"dataset": key})
    store = RunStore(engine.pool)
    store.enqueue(first.id, None, "manual", 3)
    run = _claim(store)
    second = engine.create_connection(ws.id, "b", "memory", config={"dataset": key})
    store.enqueue(second.id, None, "manual", 3)

    seal = Seal(run.lease, "succeeded", {}, {}, None)
    sealed, claimed = store.finish_and_claim(seal, ClaimTerms("store-test", 60, ["memory"]))
    assert sealed and claimed is not None and claimed.connection_id == second.id
    sealed, claimed = store.finish_and_claim(seal, ClaimTerms("store-test", 60, ["memory"]))
    assert not sealed and claimed is None  # a stale finish seals nothing; nothing left


def test_decisions_are_taken_at_the_stores_clock(engine: Engine) -> None:
    """A rate-limited sync waits while its deadline allows, by the injected clock: the same
    run, decided a day later on the same clock, gives up instead."""
    key, _ = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store = RunStore(engine.pool, clock=clock)
    store.enqueue(conn.id, None, "manual", 3)
    run = _claim(store)
    started = clock.now()
    run = ClaimedRun(**{**run.__dict__, "started_at": started})
    limited = {
        "items": TableResult.from_json(
            {
                "status": "retry",
                "error": {"kind": "rate_limited", "message": "slow down", "retry_after": 60},
            }
        )
    }
    decide = decider(run, engine.settings, store)
    assert decide(limited).action is Action.WAIT
    clock.advance(timedelta(seconds=engine.settings.run_deadline + 1).total_seconds())
    assert decide(limited).action is not Action.WAIT
