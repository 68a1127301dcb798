"""The lease keeper holds many leases of several kinds at once, on a connection of its own: each
is renewed at a third of its length and controlled on its own, one lost or cancelled lease trips
only its own abort signal, and a cut connection is reopened. The keeper's own clock drives it;
the tests wait on what it signals (each round of ticks), never on a sleep."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from sync import Engine
from sync.base.abort import AbortReason, AbortSignal
from sync.jobs.lease import Control, LeaseKeeper, LeaseKind, Terms
from sync.queues import queue_spec
from sync.queues.kind import JOB_LEASES as JOBS
from sync.queues.postgres import PostgresQueues
from sync.runs.kind import RUN_LEASES
from sync.store import Lease
from sync.store.db import Connection, connect
from tests.conftest import direct_only
from tests.test_fencing import claim
from tests.test_sync_flow import items, new_dataset

# Short terms, so that a test sees several renewals in a few seconds of the keeper's own clock.
QUICK = Terms(lease_seconds=3.0, control_interval=0.1, timeout_seconds=60)

PROBES = """
CREATE TABLE probe_leases (
    id bigint PRIMARY KEY,
    lease_owner uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false
)"""


def renew_probe(conn: Connection, lease: Lease, length: timedelta) -> bool:
    row = conn.execute(
        "UPDATE probe_leases SET lease_expires_at = now() + %s "
        "WHERE id = %s AND lease_owner = %s AND lease_expires_at > now() RETURNING id",
        (length, lease.id, lease.owner),
    ).fetchone()
    return row is not None


def probe_control(conn: Connection, lease: Lease) -> Control:
    row = conn.execute(
        "SELECT cancel_requested FROM probe_leases WHERE id = %s AND lease_owner = %s",
        (lease.id, lease.owner),
    ).fetchone()
    if row is None:
        return Control(AbortReason.LEASE_LOST)
    return Control(AbortReason.CANCELLED if row["cancel_requested"] else None)


PROBE = LeaseKind("probe", renew=renew_probe, control=probe_control)


class Ticks:
    """Counts the keeper's rounds of ticks; ``wait_until`` blocks on them, not on a clock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.rounds = 0

    def __call__(self) -> None:
        with self._cond:
            self.rounds += 1
            self._cond.notify_all()

    def wait_until(self, condition: Callable[[], bool], rounds: int = 2000) -> None:
        with self._cond:
            limit = self.rounds + rounds
            while not condition():
                assert self.rounds < limit, "the keeper ticked and the condition never held"
                assert self._cond.wait(30), "the keeper stopped ticking"


@pytest.fixture
def keeper(engine: Engine) -> Iterator[tuple[LeaseKeeper, Ticks]]:
    ticks = Ticks()
    url = engine.settings.database_url
    assert url is not None
    keeper = LeaseKeeper.for_url(engine.settings, url, on_tick=ticks)
    keeper.start()
    yield keeper, ticks
    keeper.stop()


def claimed_runs(engine: Engine, n: int) -> list[Lease]:
    key, _ = new_dataset(items=items(1))
    leases = []
    for i in range(n):
        ws = engine.create_workspace(f"w{i}")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        engine.sync(conn.id)
        row = claim(engine, "worker-a")
        leases.append(Lease(row["id"], row["lease_owner"]))
    return leases


def probes(admin: psycopg.Connection[Any], n: int) -> list[Lease]:
    admin.execute(PROBES)
    leases = [Lease(i, uuid.uuid4()) for i in range(1, n + 1)]
    for lease in leases:
        admin.execute(
            "INSERT INTO probe_leases VALUES (%s, %s, now() + interval '3 seconds')",
            (lease.id, lease.owner),
        )
    return leases


def test_many_leases_of_two_kinds_are_renewed_and_only_a_lost_one_stops(
    engine: Engine, admin: psycopg.Connection[Any], keeper: tuple[LeaseKeeper, Ticks]
) -> None:
    keep, ticks = keeper
    runs = claimed_runs(engine, 3)
    jobs = probes(admin, 4)
    watches = [keep.watch(lease, AbortSignal(), kind=RUN_LEASES, terms=QUICK) for lease in runs]
    watches += [keep.watch(lease, AbortSignal(), kind=PROBE, terms=QUICK) for lease in jobs]
    assert keep.watched == 7

    # Each lease is renewed again and again, past its 3 s length.
    ticks.wait_until(lambda: all(w.renewals >= 4 for w in watches))
    assert not any(w.abort.is_set for w in watches)
    assert keep.renewals["run"] >= 12 and keep.renewals["probe"] >= 16
    expiries = admin.execute(
        "SELECT count(*) AS n FROM connection_runs WHERE lease_expires_at > now()"
    ).fetchone()
    assert expiries["n"] == 3

    # Another claim takes one job over: only that job's holder is told to stop.
    admin.execute("UPDATE probe_leases SET lease_owner = gen_random_uuid() WHERE id = 2")
    lost = next(w for w in watches if w.kind is PROBE and w.lease.id == 2)
    ticks.wait_until(lambda: lost.abort.is_set)
    assert lost.abort.reason is AbortReason.LEASE_LOST
    assert keep.losses == {"probe": 1}

    # A cancel requested on one run trips only that run, as cancelled.
    admin.execute(
        "UPDATE connection_runs SET cancel_requested_at = now() WHERE id = %s", (runs[0].id,)
    )
    ticks.wait_until(lambda: watches[0].abort.is_set)
    assert watches[0].abort.reason is AbortReason.CANCELLED
    others = [w for w in watches if w is not lost and w is not watches[0]]
    before = {id(w): w.renewals for w in others}
    ticks.wait_until(lambda: all(w.renewals > before[id(w)] for w in others))
    assert not any(w.abort.is_set for w in others)

    # A released lease is no longer renewed: it runs out.
    for w in watches:
        keep.release(w)
    assert keep.watched == 0


@direct_only(
    "the test cuts the engine's own backends by their application_name; behind PgBouncer the "
    "server connections are PgBouncer's, and it replaces one cut while idle"
)
def test_a_cut_connection_is_reopened_and_no_lease_is_lost(
    engine: Engine, admin: psycopg.Connection[Any], keeper: tuple[LeaseKeeper, Ticks]
) -> None:
    keep, ticks = keeper
    terms = Terms(lease_seconds=3, control_interval=0.05, timeout_seconds=60)
    watch = keep.watch(claimed_runs(engine, 1)[0], AbortSignal(), kind=RUN_LEASES, terms=terms)
    ticks.wait_until(lambda: watch.renewals >= 1)
    cut = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
        "WHERE application_name = %s",
        (f"connector-sync/{engine.settings.schema_name}/lease",),
    ).fetchone()
    assert cut["n"] == 1
    ticks.wait_until(lambda: keep.failures >= 1)
    renewed = watch.renewals
    ticks.wait_until(lambda: watch.renewals >= renewed + 2)
    assert not watch.abort.is_set


def test_the_keeper_never_touches_the_workers_pool(engine: Engine) -> None:
    """Every pooled connection held (lanes at their maximum): renewals still go through."""
    ticks = Ticks()
    url = engine.settings.database_url
    assert url is not None
    opened: list[Connection] = []

    def own_connection() -> Connection:
        conn = connect(engine.settings, url, purpose="lease")
        opened.append(conn)
        return conn

    keep = LeaseKeeper(engine.settings, own_connection, on_tick=ticks)
    lease = claimed_runs(engine, 1)[0]
    held = [engine.pool.getconn() for _ in range(engine.pool.max_size)]
    try:
        keep.start()
        watch = keep.watch(lease, AbortSignal(), kind=RUN_LEASES, terms=QUICK)
        ticks.wait_until(lambda: watch.renewals >= 3)
        assert not watch.abort.is_set
        assert len(opened) == 1
    finally:
        keep.stop()
        for conn in held:
            engine.pool.putconn(conn)


def test_job_leases_held_together_are_renewed_and_controlled_one_statement_for_all(
    engine: Engine, admin: psycopg.Connection[Any]
) -> None:
    """A batch's jobs (or many lanes' jobs): one renewal statement and one control statement
    serve every lease due about then, and a cancelled or lost one still trips only its own."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.embed", expire=600))
    queues.register_batch("docs.embed", lambda jobs, abort: None, size=30)
    ids = [queues.send("docs.embed", {"n": n}) for n in range(30)]
    attempts = queues.claim(["docs.embed"], 30)
    assert sorted(a.job.id for a in attempts) == ids

    statements: list[str] = []
    url = engine.settings.database_url
    assert url is not None

    def counted() -> Connection:
        conn = connect(engine.settings, url, purpose="lease")
        execute = conn.execute

        def counting(query: Any, *args: Any, **kwargs: Any) -> Any:
            statements.append(query.as_string(conn) if hasattr(query, "as_string") else query)
            return execute(query, *args, **kwargs)

        conn.execute = counting  # type: ignore[method-assign]
        return conn

    ticks = Ticks()
    keep = LeaseKeeper(engine.settings, counted, on_tick=ticks)
    keep.start()
    try:
        watches = [
            keep.watch(Lease(a.job.id, a.lease_owner), AbortSignal(), kind=JOBS, terms=QUICK)
            for a in attempts
        ]
        ticks.wait_until(lambda: all(w.renewals >= 2 for w in watches))
        renewals = sum(w.renewals for w in watches)
        renews = sum("UPDATE jobs j" in s for s in statements)
        controls = sum("unnest" in s and "LEFT JOIN jobs" in s for s in statements)
        singles = sum(
            "WHERE id = %(job_id)s" in s or "job_id)s, %(lease_owner" in s for s in statements
        )
        assert not any(w.abort.is_set for w in watches)

        # One job cancelled, another taken over: only those two stop, each for its reason.
        cancelled, taken = watches[3], watches[7]
        queues.cancel_job(cancelled.lease.id)
        admin.execute(
            "UPDATE jobs SET lease_owner = gen_random_uuid() WHERE id = %s", (taken.lease.id,)
        )
        ticks.wait_until(lambda: cancelled.abort.is_set and taken.abort.is_set)
        others = [w for w in watches if w not in (cancelled, taken)]
        before = {id(w): w.renewals for w in others}
        ticks.wait_until(lambda: all(w.renewals > before[id(w)] for w in others))
    finally:
        keep.stop()
    assert renewals >= 60
    assert singles == 0
    assert renews * 10 <= renewals, (renews, renewals)  # 30 leases a statement, give or take
    assert controls >= 1
    assert cancelled.abort.reason is AbortReason.CANCELLED
    assert taken.abort.reason is AbortReason.LEASE_LOST
    assert not any(w.abort.is_set for w in others)
    assert keep.losses == {"job": 1}
