"""The typed store of the runs path: the one retry decision (what is repeated, and what never
is), typed rows through a run's life against the real Postgres, and the injectable clock the
engine's own decisions are taken at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from connectors import PermanentError
from sync import Engine
from sync.jobs.outcome import Action
from sync.models import Workspace
from sync.runs.decide import AttemptReport, TableResult
from sync.runs.outcome import decide_run
from sync.store import (
    ClaimedRun,
    ClaimTerms,
    ManualClock,
    OverviewStore,
    RetryPolicy,
    RunStore,
    Seal,
    TenantStore,
    UnservedProvider,
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

    def decide() -> Action:
        return decide_run(run, AttemptReport(limited), engine.settings, store.now()).action

    assert decide() is Action.WAIT
    clock.advance(timedelta(seconds=engine.settings.run_deadline + 1).total_seconds())
    assert decide() is not Action.WAIT


def test_a_repair_is_one_transaction_repeated_whole_after_a_transient_failure(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's statements go through the store's RetryPolicy too: a deadlock in the middle of
    an operator's repair (after the row lock, before the update) rolls it back, and the repair
    is made, once, by the repeated transaction (a lock left behind would block it)."""
    key, _ = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    encrypt = engine.secrets.encrypt
    failures: list[Exception] = [psycopg.errors.DeadlockDetected()]

    def deadlocks_once(credentials: dict[str, Any]) -> bytes:
        if failures:
            raise failures.pop()
        return encrypt(credentials)

    monkeypatch.setattr(engine.secrets, "encrypt", deadlocks_once)
    repaired = engine.update_connection(conn.id, name="renamed", credentials={"token": "t"})
    assert (repaired.name, repaired.has_credentials, failures) == ("renamed", True, [])


def test_tenants_and_what_operators_see_in_typed_rows(engine: Engine) -> None:
    tenants, overview = TenantStore(engine.pool), OverviewStore(engine.pool)
    ws = tenants.create_workspace("acme")
    assert isinstance(ws, Workspace) and tenants.workspace_by_name("acme") == ws
    key, _ = new_dataset(items=items(1, 2))
    conn = tenants.create_connection(
        workspace_id=ws.id,
        name="mem",
        provider="memory",
        config={"dataset": key},
        credentials=None,
        budget_key=None,
        schedule_seconds=None,
    )
    assert conn is not None and tenants.connections(ws.id) == [conn]
    queued = RunStore(engine.pool).enqueue(conn.id, ws.id, "manual", 3)
    assert queued is not None
    # No worker is alive: the queued sync is one no worker can take.
    assert overview.unserved(60, ws.id) == [UnservedProvider("memory", 1, queued.id)]
    assert [c.active_run for c in overview.connections_overview(ws.id, limit=10)] != [None]
    purges = tenants.delete_workspace(ws.id, 3)
    assert [p.kind for p in purges] == ["purge"]
    assert tenants.delete_workspace(ws.id, 3) == purges  # the purges still pending
    assert tenants.rename_workspace(ws.id, "other") is None  # deleted


def test_a_connection_s_last_run_is_the_one_that_finished_last(engine: Engine) -> None:
    key, data = new_dataset(items=items(1))
    data.failures["items"] = data.failures["notes"] = (0, PermanentError("refused"))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    worker = engine.worker(listen=False)
    first = engine.sync(conn.id)
    assert worker.poll() and engine.run(first.id).status == "failed"
    data.failures.clear()
    second = engine.sync(conn.id)
    assert worker.poll() and engine.run(second.id).status == "succeeded"
    # The first run, retried, now ends after the second: it is the last run.
    data.failures["items"] = data.failures["notes"] = (0, PermanentError("refused again"))
    engine.retry_run(first.id)
    assert worker.poll() and engine.run(first.id).status == "failed"
    (shown,) = engine.connections_overview(ws.id)
    assert shown.last_run is not None
    assert (shown.last_run.id, shown.last_run.status) == (first.id, "failed")
