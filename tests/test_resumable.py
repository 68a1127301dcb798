"""Resumable syncs: a table larger than one rate window finishes in one run, waiting without
spending attempts; an attempt that ends mid-table (a failure, a killed worker, a worker told to
stop, which hands the run back without spending an attempt) is resumed by the next at its last
committed page; seen keys lost to a crash restart of Postgres never turn into
tombstones; a run that waited past its deadline fails saying so; each attempt keeps its own
counts."""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from connectors import RateLimited, RetryableError
from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.cli.commands import describe_progress
from sync.runs.kind import renew_run
from sync.store import Lease
from sync.testing import make_run_due, run_sync
from tests.conftest import make_settings
from tests.fakes import DATASETS
from tests.test_fencing import claim, spawn_worker
from tests.test_sync_flow import items, live, new_dataset, tombstoned


@pytest.fixture
def simulation() -> Simulation:
    return Simulation()


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def tracker(engine: Engine, server: str, tenant: str, name: str = "tracker") -> int:
    ws = engine.workspaces()[0] if engine.workspaces() else engine.create_workspace("sim")
    return engine.create_connection(
        ws.id,
        name,
        "simulated",
        config={"base_url": server, "tenant": tenant, "page_size": 10},
        credentials={"token": f"sim-{tenant}"},
    ).id


def stored(engine: Engine, connection_id: int, table: str) -> dict[str, Any]:
    """What a connection holds of a table: each row's data, and whether it is tombstoned."""
    return {
        r.external_id: (r.data, r.deleted_at is not None)
        for r in engine.records(connection_id, table, include_deleted=True, limit=100_000)
    }


def test_a_table_larger_than_one_rate_window_finishes_in_one_run(
    sync_engine: Engine, server: str, simulation: Simulation
) -> None:
    # 500 issues and 50 projects, ten a page: 55 pages, behind a budget of 10 requests per
    # rate window whose end is an hour away. The test is the clock: it ends each window.
    wide = simulation.add_tenant("wide", size=500, seed=3)
    wide.configure(budget=10, window=3600)
    conn_id = tracker(sync_engine, server, "wide")
    pages = math.ceil(500 / 10) + math.ceil(50 / 10)

    run = sync_engine.sync(conn_id)
    worker = sync_engine.worker(listen=False)
    for _ in range(20):
        worker.poll()
        run = sync_engine.run(run.id)
        if run.is_terminal:
            break
        # Waiting, not failing: no attempt is spent, and the run says for what and until when.
        assert run.status == "queued" and run.attempts == 0, run
        assert run.waiting_for == "the simulated rate limit"
        assert run.waiting_until is not None and run.waiting_until == run.queued_at
        wide.reset_window()
        assert make_run_due(sync_engine, run.id)

    assert run.status == "succeeded", run.error
    assert run.attempts == 1 and run.waits >= 4
    assert wide.stats.requests <= pages + run.waits + 2
    for table in ("projects", "issues"):
        upstream = {str(r["id"]): (r, False) for r in wide.rows(table)}
        assert stored(sync_engine, conn_id, table) == upstream
    outcomes = [a.outcome for a in sync_engine.attempts(run.id)]
    assert outcomes == ["rate_limited"] * run.waits + ["succeeded"]
    assert all(a.waiting_until for a in sync_engine.attempts(run.id)[:-1])
    # Each attempt counts only its own records; the run counts them all.
    assert sum(a.results["issues"]["upserted"] for a in sync_engine.attempts(run.id)
               if a.results and "issues" in a.results) == 500  # fmt: skip
    assert run.results["issues"]["upserted"] == 500 and run.processed_units == 550
    assert run.total_units == 550  # both tables' X-Total-Count


@pytest.mark.slow
def test_a_worker_killed_mid_table_is_resumed_where_it_stopped(
    schema: str, server: str, simulation: Simulation
) -> None:
    big = simulation.add_tenant("big", size=300, seed=5)
    settings = make_settings(schema, lease_seconds=30.0, batch_size=10)
    with Engine(settings) as engine:
        engine.migrate()
        killed_id = tracker(engine, server, "big", "killed")
        calm_id = tracker(engine, server, "big", "calm")
        for conn_id in (killed_id, calm_id):  # both hold the same rows, then upstream changes
            assert run_sync(engine, conn_id).status == "succeeded"
        big.advance()

        # The worker process is killed while it asks for page 12 of the issues: the provider
        # holds that request until the worker is dead.
        reached, killed = threading.Event(), threading.Event()

        def at_page_12(page: int, size: int) -> None:
            if page == 12:
                reached.set()
                assert killed.wait(60), "the test never killed the worker"

        big.on_change("issues", at_page_12)
        big.log.clear()
        run = engine.sync(killed_id)
        worker = spawn_worker(schema, "--batch-size", "10", "--lease-seconds", "30")
        try:
            assert reached.wait(60), "the worker never reached page 12"
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(30)
        finally:
            killed.set()
            worker.kill()
            worker.communicate(timeout=30)
        big.on_change("issues", None)
        before_kill = list(big.log)
        with engine.pool.connection() as conn:
            # How far the killed attempt got: the position saved with its last batch.
            saved = conn.execute(
                "SELECT position FROM run_checkpoints WHERE run_id = %s AND table_name = 'issues'",
                (run.id,),
            ).fetchone()
            resume_at = _pages([saved["position"]["next"].split("/")[-1]])[0]
            # The lease runs out (the test is the clock).
            conn.execute(
                "UPDATE connection_runs SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = %s",
                (run.id,),
            )

        # The next worker resumes the run at the last page whose records were committed.
        big.log.clear()
        assert engine.worker(listen=False).poll()
        done = engine.run(run.id)
        assert done.status == "succeeded", done.error
        assert [a.outcome for a in engine.attempts(run.id)] == ["lost", "succeeded"]
        after_kill = _pages(big.log)
        assert resume_at >= 11 and after_kill[0] == resume_at  # not from the start
        # Pages whose records had committed before the kill (those before the saved position)
        # read again: none, and never more than one.
        again = [p for p in after_kill if p < resume_at]
        assert len(again) <= 1, (again, _pages(before_kill), after_kill)

        # The result is what an uninterrupted sync makes of the same data, tombstones included.
        assert run_sync(engine, calm_id).status == "succeeded"
        for table in ("projects", "issues"):
            assert stored(engine, killed_id, table) == stored(engine, calm_id, table)
        assert any(gone for _, gone in stored(engine, killed_id, "issues").values())


def test_a_run_handed_back_at_shutdown_resumes_mid_table_without_spending_an_attempt(
    sync_engine: Engine, server: str, simulation: Simulation
) -> None:
    # 30 projects and 300 issues, ten a page; each page's batch commits with its position.
    big = simulation.add_tenant("big", size=300, seed=5)
    conn_id = tracker(sync_engine, server, "big")
    sync_engine.settings.batch_size = 10
    upstream = {t: {str(r["id"]): (r, False) for r in big.rows(t)} for t in ("projects", "issues")}

    # The worker is told to stop (what its SIGTERM handler does) while it asks for page 12 of
    # the issues: the run goes back to the queue.
    run = sync_engine.sync(conn_id)
    stopping = sync_engine.worker(listen=False)
    big.on_change("issues", lambda page, size: stopping.stop() if page == 12 else None)
    assert stopping.poll()
    stopping.close()
    big.on_change("issues", None)
    back = sync_engine.run(run.id)
    assert back.status == "queued" and back.attempts == 0, back  # no attempt spent
    assert [a.outcome for a in sync_engine.attempts(run.id)] == ["handed_back"]
    with sync_engine.pool.connection() as conn:
        saved = conn.execute(
            "SELECT position FROM run_checkpoints WHERE run_id = %s AND table_name = 'issues'",
            (run.id,),
        ).fetchone()
    assert saved is not None and saved["position"] is not None
    resume_at = _pages([saved["position"]["next"].split("/")[-1]])[0]
    assert resume_at >= 11

    # The next worker resumes the issues at the last committed page.
    big.log.clear()
    assert sync_engine.worker(listen=False).poll()
    done = sync_engine.run(run.id)
    assert done.status == "succeeded" and done.attempts == 1, done.error
    assert [a.outcome for a in sync_engine.attempts(run.id)] == ["handed_back", "succeeded"]
    after = _pages(big.log)
    assert after[0] == resume_at and len([p for p in after if p < resume_at]) <= 1
    assert not any(entry.startswith("projects?") for entry in big.log)  # settled before

    # Counted once: the run's totals are an uninterrupted sync's, and each attempt counts
    # only what it did.
    assert done.processed_units == 330
    assert done.results["projects"]["upserted"] == 30
    assert done.results["issues"]["upserted"] == 300
    first, second = sync_engine.attempts(run.id)
    assert first.results["issues"]["upserted"] == (resume_at - 1) * 10  # the pages committed
    for table in ("projects", "issues"):
        mine = [a.results[table]["upserted"] for a in (first, second) if table in a.results]
        assert sum(mine) == done.results[table]["upserted"], (table, mine)
        assert stored(sync_engine, conn_id, table) == upstream[table]


def _pages(log: list[str]) -> list[int]:
    """The page numbers of the issues listings in a request log."""
    found = []
    for entry in log:
        if entry.startswith("issues?"):
            query = dict(p.split("=") for p in entry.split("?", 1)[1].split("&"))
            found.append(int(query.get("page", "1")))
    return found


def test_a_failed_attempt_resumes_at_its_last_committed_page_and_counts_its_own(
    engine: Engine, admin: Any
) -> None:
    key, data = new_dataset(items=items(*range(1, 31)))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "pages", "memory_pages", config={"dataset": key, "page_size": 5}
    )
    assert run_sync(engine, conn.id).status == "succeeded"

    # Upstream: 1 and 12 vanish, 27 changes. The read breaks on page 4 (row index 17).
    data.tables["items"] = [
        *items(*range(2, 12)),
        *items(*range(13, 27)),
        *items(27, version="v2"),
        *items(28, 29, 30),
    ]
    data.failures["items"] = (17, RetryableError("connection reset"))
    data.reads.clear()
    run = run_sync(engine, conn.id)
    assert run.status == "succeeded" and run.attempts == 2
    # Pages 1-3 once, page 4 in both attempts (it failed), then 5 and 6.
    assert data.reads == [
        "items:1",
        "items:2",
        "items:3",
        "items:4",
        "items:4",
        "items:5",
        "items:6",
    ]
    assert tombstoned(admin, conn.id) == {"1", "12"}
    assert live(admin, conn.id)["27"]["version"] == "v2"

    first, second = engine.attempts(run.id)
    assert (first.outcome, second.outcome) == ("retry", "succeeded")
    assert first.results["items"]["unchanged"] == 15 and first.results["items"]["status"] == "retry"
    assert second.results["items"] == {
        "status": "succeeded", "upserted": 1, "unchanged": 12, "tombstoned": 2, "error": None,
        "total": 28,
    }  # fmt: skip
    assert run.results["items"] == {
        "status": "succeeded", "upserted": 1, "unchanged": 27, "tombstoned": 2, "error": None,
        "total": 28,
    }  # fmt: skip


def test_seen_keys_lost_to_a_crash_restart_are_never_tombstones(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(*range(1, 21)))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "pages", "memory_pages", config={"dataset": key, "page_size": 5}
    )
    assert run_sync(engine, conn.id).status == "succeeded"

    # Nothing changes upstream. Attempt 1 sees pages 1 and 2 unchanged, then fails on page 3.
    data.failures["items"] = (10, RetryableError("connection reset"))
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)
    assert worker.poll()
    assert engine.run(run.id).status == "queued"
    # A crash restart of Postgres empties every unlogged table: what attempt 1 saw is gone.
    admin.execute("TRUNCATE run_seen_keys")
    data.reads.clear()
    assert make_run_due(engine, run.id)
    assert worker.poll()

    done = engine.run(run.id)
    assert done.status == "succeeded", done.error
    assert tombstoned(admin, conn.id) == set()  # pages 1 and 2 were not taken for deleted
    assert data.reads == ["items:1", "items:2", "items:3", "items:4"]  # read again from page 1
    assert done.results["items"]["tombstoned"] == 0


def test_a_run_that_waited_past_its_deadline_fails_saying_so(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(1, 2))
    data.failures["items"] = (0, RateLimited("429 from the provider", retry_after=3600))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)
    assert worker.poll()
    waiting = engine.run(run.id)
    assert (waiting.status, waiting.attempts, waiting.waits) == ("queued", 0, 1)

    # The run began 23.5 hours ago (the test is the clock); its next wait would end past the
    # 24-hour deadline.
    admin.execute(
        "UPDATE connection_runs SET started_at = now() - interval '23 hours 30 minutes' "
        "WHERE id = %s",
        (run.id,),
    )
    data.failures["items"] = (0, RateLimited("429 from the provider", retry_after=3600))
    assert make_run_due(engine, run.id)
    assert worker.poll()
    failed = engine.run(run.id)
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.kind == "deadline"
    message = failed.error.message
    assert "the memory rate limit" in message and "2nd wait" in message
    assert "24 h" in message and "run_deadline" in message
    assert DATASETS[key].reads.count("items") == 2


def test_what_sync_wait_and_runs_show_say_of_a_waiting_or_running_run(
    engine: Engine, admin: Any
) -> None:
    key, data = new_dataset(items=items(*range(1, 8)))
    data.failures["items"] = (5, RateLimited("429 from the provider", retry_after=3600))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "pages", "memory_pages", config={"dataset": key, "page_size": 3}
    )
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)
    for n in range(3):  # three waits
        assert worker.poll()
        run = engine.run(run.id)
        if n < 2:
            data.failures["items"] = (5, RateLimited("429 again", retry_after=3600))
            assert make_run_due(engine, run.id)
    assert run.status == "queued" and run.waits == 3 and run.waiting_until is not None
    now = run.waiting_until - timedelta(minutes=30)
    line = describe_progress(run, workers_alive=1, now=now)
    assert line == (
        f"waiting for the memory_pages rate limit until {run.waiting_until:%H:%M} UTC, 3rd wait"
    )

    # Running: table k of n, the page, records read of the total the provider gave.
    running = replace(run, status="running", attempts=1)
    assert run.progress == {
        "table": "items", "table_index": 1, "tables": 1, "partition": None, "page": 1,
        "records": 3, "total": 7,
    }  # fmt: skip
    assert describe_progress(running, workers_alive=1, now=now) == (
        "running attempt 1 of 3: table 1 of 1 (items), page 1, 3 of 7 records"
    )


# As if the sweep interval had passed since a worker last swept (see maintenance_runs).
SWEEP_DUE = (
    "UPDATE maintenance_runs SET last_run_at = now() - interval '1 day' "
    "WHERE task = 'sweep_seen_keys'"
)


def test_seen_keys_outlive_an_attempt_but_not_the_run(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(*range(1, 11)))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "pages", "memory_pages", config={"dataset": key, "page_size": 5}
    )
    assert run_sync(engine, conn.id).status == "succeeded"

    # A resync sees page 1 unchanged, then waits for a rate limit before page 2.
    data.failures["items"] = (5, RateLimited("429", retry_after=3600))
    run = engine.sync(conn.id)
    assert engine.worker(listen=False).poll()
    assert engine.run(run.id).status == "queued"
    count = "SELECT count(*) AS n FROM run_seen_keys WHERE run_id = %s"
    assert admin.execute(count, (run.id,)).fetchone()["n"] == 5
    # Another worker's sweep (its turn comes: the sweep interval has passed) keeps the keys of a
    # run that waits in the queue...
    admin.execute(SWEEP_DUE)
    assert engine.worker(listen=False).sweeper.run_once() == {"seen_keys": 0}
    assert admin.execute(count, (run.id,)).fetchone()["n"] == 5
    # ...and collects those a finished run left behind.
    admin.execute("INSERT INTO run_seen_keys VALUES (%s, 'items', 'x')", (run.id - 1,))
    assert make_run_due(engine, run.id)
    worker = engine.worker(listen=False)
    assert worker.poll()
    assert engine.run(run.id).status == "succeeded"
    admin.execute(SWEEP_DUE)
    assert worker.sweeper.run_once() == {"seen_keys": 1}
    assert admin.execute("SELECT count(*) AS n FROM run_seen_keys").fetchone()["n"] == 0
    assert tombstoned(admin, conn.id) == set()


def test_each_renewal_notes_the_lease_on_the_attempt(engine: Engine, admin: Any) -> None:
    """An attempt whose worker dies held its run until its last lease ran out: the attempt's
    history row says when, whatever later claim records its end (the chaos run's limiter check
    reads it)."""
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    engine.sync(conn.id)
    claimed = claim(engine, "worker-a")
    lease = Lease(claimed["id"], claimed["lease_owner"])
    with engine.pool.connection() as db:
        assert renew_run(db, lease, timedelta(seconds=300))
    row = admin.execute(
        "SELECT r.lease_expires_at AS run, a.lease_expires_at AS attempt "
        "FROM connection_runs r JOIN run_attempts a ON a.lease_owner = r.lease_owner"
    ).fetchone()
    assert row["attempt"] == row["run"]
