"""A worker that has lost its lease can never change a connection's data, and stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors import Checkpoint, Deletions, Mode, Table
from sync import Engine
from sync.base.abort import AbortReason, AbortSignal
from sync.errors import LeaseLost
from sync.runs.kind import read_run_control, renew_run
from sync.runs.records import RecordWriter
from sync.runs.tombstones import TombstonePass
from sync.store import Lease
from sync.store.queries import QUERIES
from tests.cli_backends import WorkerProcess
from tests.conftest import make_settings
from tests.test_sync_flow import items, new_dataset
from tests.waiting import wait_stopped

AUDIT = """
CREATE TABLE record_audit (written_by uuid, op text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION audit_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO record_audit (written_by, op) VALUES (NEW.written_by, TG_OP);
    RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON records
    FOR EACH ROW EXECUTE FUNCTION audit_record();
"""


def claim(engine: Engine, worker_id: str) -> dict[str, Any]:
    with engine.pool.connection() as conn:
        row = conn.execute(
            QUERIES.claim_run,
            {
                "worker_id": worker_id,
                "lease": timedelta(seconds=120),
                "providers": None,
                "wakeable": False,
            },
        ).fetchone()
    assert row is not None
    return dict(row)


def test_every_write_of_a_stale_claim_matches_nothing(engine: Engine, admin: Any) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    engine.sync(conn.id)
    first = claim(engine, "worker-a")
    stale = Lease(first["id"], first["lease_owner"])
    table = Table("items", "id", Mode.FULL)
    events = Table("events", "id", Mode.INCREMENTAL, deletions=Deletions.FEED)

    with engine.pool.connection() as db:
        writer = RecordWriter(db, stale, conn.id, table, batch_size=10, abort=AbortSignal())
        writer.write({"id": 1, "v": "a"})
        writer.flush()  # the lease is live: this lands
        assert admin.execute("SELECT count(*) AS n FROM records").fetchone()["n"] == 1

        # The lease runs out. Nobody has claimed the run yet, but the claim is already dead:
        # the limiter treats an expired lease as free, so the writes must too.
        admin.execute("UPDATE connection_runs SET lease_expires_at = now() - interval '1 second'")
        assert renew_run(db, stale, timedelta(seconds=120)) is False
        assert read_run_control(db, stale).stop is AbortReason.LEASE_LOST
        writer.write({"id": 1, "v": "stale"})
        with pytest.raises(LeaseLost):
            writer.flush()

        second = claim(engine, "worker-b")
        assert second["id"] == first["id"] and second["lease_owner"] != first["lease_owner"]
        assert second["attempts"] == 2
        before = admin.execute("SELECT data, updated_at FROM records").fetchall()

        def stale_writer(on: Table) -> RecordWriter:
            return RecordWriter(db, stale, conn.id, on, batch_size=1, abort=AbortSignal())

        batch = stale_writer(table)
        batch.write({"id": 2, "v": "stale"})  # batch_size 1: written at once, in the background
        with pytest.raises(LeaseLost):
            batch.flush()  # which waits for that write
        batch.close()
        with pytest.raises(LeaseLost):
            TombstonePass(db, stale, conn.id, table, AbortSignal(), step=100).run(
                [""], every_partition=True, confirm=None
            )
        with pytest.raises(LeaseLost):
            stale_writer(events).write(Checkpoint({"seq": 9}))  # the cursor
        params = {
            "run_id": first["id"],
            "lease_owner": first["lease_owner"],
            "results": None,
            "attempt_results": None,
            "error": None,
        }
        assert (
            db.execute(
                QUERIES.finish_run,
                {**params, "status": "succeeded", "processed_units": None, "disconnect": False},
            ).fetchone()["sealed"]
            == 0
        )
        assert db.execute(QUERIES.requeue_run, {**params, "delay_seconds": 1}).fetchone() is None
        waited = {**params, "delay_seconds": 1, "waiting_for": "the memory rate limit"}
        assert db.execute(QUERIES.wait_for_rate_limit, waited).fetchone() is None
        assert db.execute(QUERIES.hand_back_run, params).fetchone()["moved"] == 0
        assert db.execute(QUERIES.save_results, params).fetchone() is None

    assert admin.execute("SELECT data, updated_at FROM records").fetchall() == before
    assert admin.execute("SELECT count(*) AS n FROM table_state").fetchone()["n"] == 0
    run = engine.run(first["id"])
    assert run.status == "running" and run.lease_owner == second["lease_owner"]
    assert [a.outcome for a in engine.attempts(run.id)] == ["lost", None]


def spawn_worker(schema: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.worker_process", "--schema", schema, *extra],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )


@pytest.mark.slow
def test_a_paused_worker_loses_its_run_and_writes_nothing_after(
    schema: str, admin: Any, tmp_path: Path
) -> None:
    settings = make_settings(schema, control_interval=0.5, batch_size=3)
    source = tmp_path / "items.json"
    source.write_text(json.dumps({"items": items(*range(60), version="v1")}))
    with Engine(settings) as engine:
        engine.migrate()
        admin.execute(AUDIT)
        ws = engine.create_workspace("acme")
        # Worker A stops itself as it reaches row 30: by then at least 27 rows are committed
        # (one batch of 3 in flight at most).
        config = {"path": str(source), "pause_after": 30, "pause_flag": str(tmp_path / "paused")}
        conn = engine.create_connection(ws.id, "files", "filedata", config=config)
        run = engine.sync(conn.id)
        a = WorkerProcess(
            spawn_worker(
                schema, "--worker-id", "worker-a", "--control-interval", "0.5", "--batch-size", "3"
            )
        )
        try:
            wait_stopped(a.proc)
            assert admin.execute("SELECT count(*) AS n FROM records").fetchone()["n"] >= 27
            stale = engine.attempts(run.id)[0].lease_owner
            source.write_text(json.dumps({"items": items(*range(20), version="v2")}))
            # A's lease runs out while it is frozen (the test is the clock).
            admin.execute("UPDATE connection_runs SET lease_expires_at = now() - interval '1 s'")

            b = engine.worker(worker_id="worker-b", listen=False)
            assert b.poll()
            done = engine.run(run.id)
            assert done.status == "succeeded" and done.attempts == 2
            b_started = engine.attempts(run.id)[1].started_at

            os.kill(a.pid, signal.SIGCONT)
            # A runs on until it notices, and says so.
            assert a.wait_for("lease lost"), a.log
        finally:
            os.kill(a.pid, signal.SIGCONT)
            a.stop()

        late = admin.execute(
            "SELECT count(*) AS n FROM record_audit WHERE written_by = %s AND at >= %s",
            (stale, b_started),
        ).fetchone()["n"]
        assert late == 0
        rows = admin.execute(
            "SELECT external_id, data ->> 'version' AS v, deleted_at IS NOT NULL AS gone "
            "FROM records"
        ).fetchall()
        assert {r["external_id"] for r in rows if not r["gone"]} == {str(i) for i in range(20)}
        assert {r["v"] for r in rows if not r["gone"]} == {"v2"}
        gone = {r["external_id"] for r in rows if r["gone"]}
        assert gone and gone == {r["external_id"] for r in rows if int(r["external_id"]) >= 20}
        assert engine.run(run.id).status == "succeeded"  # A's finish changed nothing
        assert [a.outcome for a in engine.attempts(run.id)] == ["lost", "succeeded"]


@pytest.mark.slow
def test_sigterm_hands_the_run_back_without_spending_an_attempt(
    schema: str, admin: Any, tmp_path: Path
) -> None:
    settings = make_settings(schema)
    source = tmp_path / "items.json"
    source.write_text(json.dumps({"items": items(*range(100))}))
    with Engine(settings) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        config = {"path": str(source), "pause_after": 10, "pause_flag": str(tmp_path / "paused")}
        conn = engine.create_connection(ws.id, "files", "filedata", config=config)
        run = engine.sync(conn.id)
        worker = spawn_worker(schema, "--batch-size", "5")
        wait_stopped(worker)  # mid-table: it stopped itself at row 10
        assert engine.run(run.id).status == "running"
        worker.send_signal(signal.SIGTERM)  # delivered as it resumes
        worker.send_signal(signal.SIGCONT)
        output = worker.communicate(timeout=30)[0]
        assert worker.returncode == 0, output
        back = engine.run(run.id)
        assert back.status == "queued" and back.attempts == 0, output
        assert back.lease_owner is None
        assert [a.outcome for a in engine.attempts(run.id)] == ["handed_back"]
        assert engine.workers()[0].stopped_at is not None

        source.write_text(json.dumps({"items": items(*range(10))}))
        assert engine.worker(listen=False).poll()
        done = engine.run(run.id)
        assert done.status == "succeeded" and done.attempts == 1
