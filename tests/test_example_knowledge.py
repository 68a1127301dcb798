"""The example application of examples/knowledge runs end to end on the real Postgres with a
real worker process: its sweeps, pulls, ingestion, dead letters and department reconciles run
as application jobs in lanes beside the connection sync it asks for, on one worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.knowledge.app import DEPARTMENT, INGEST, SYNC_SWEEP, Knowledge
from sync import Engine
from sync.queues import JobStatus
from tests.conftest import make_settings
from tests.test_sync_flow import items
from tests.waiting import poll_until

LANES = (
    "knowledge.ingest=4,knowledge.ingest.sweep=1,knowledge.sync=1,knowledge.sync.sweep=1,"
    "gateway.department.sync=2"
)
WAIT = 120.0


@pytest.mark.slow
def test_the_knowledge_example_runs_app_jobs_and_syncs_on_one_worker(
    engine: Engine, admin: Any, schema: str, tmp_path: Path
) -> None:
    source = tmp_path / "items.json"
    rows = [*items(1, 2, 3), {"id": 4, "title": "scan.broken", "version": "v1"}]
    source.write_text(json.dumps({"items": rows}))
    app = Knowledge(engine)
    app.declare(engine.queues)
    app.add_departments("sales", "support")
    ws = engine.create_workspace("acme")
    connection = engine.create_connection(ws.id, "docs", "filedata", config={"path": str(source)})

    env = {
        **os.environ,
        "DATABASE_URL": make_settings(schema).database_url or "",
        "CONNECTOR_SYNC_SCHEMA": schema,
        "CONNECTOR_SYNC_LANES": LANES,
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.worker_process",
            "--schema",
            schema,
            "--worker-id",
            "fleet-1",
            "--app",
            "examples.knowledge.app:setup",
        ],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        sweep = engine.queues.send(SYNC_SWEEP, None)
        first = app.reconcile("sales")
        assert app.reconcile("sales") == first  # one pending reconcile per department
        app.reconcile("support")

        def documents() -> dict[str, str]:
            found = admin.execute("SELECT name, status FROM knowledge_documents").fetchall()
            return {r["name"]: r["status"] for r in found}

        expected = {
            "item 1": "indexed",
            "item 2": "indexed",
            "item 3": "indexed",
            "scan.broken": "failed",
        }
        poll_until(lambda: documents() == expected, timeout=WAIT)
        poll_until(
            lambda: all(
                r["reconciled_times"] == 1
                for r in admin.execute("SELECT * FROM gateway_departments").fetchall()
            ),
            timeout=WAIT,
        )
        (lanes,) = [w.lanes for w in engine.workers()]
        online = engine.lanes_online()
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=WAIT)[0]
    assert worker.returncode == 0, output

    assert lanes == {q: int(n) for q, n in (p.split("=") for p in LANES.split(","))}
    assert online == lanes
    (run,) = engine.runs(connection_id=connection.id)
    assert (run.status, run.trigger) == ("succeeded", "knowledge.sync")
    assert engine.queues.get_job(sweep).status is JobStatus.COMPLETED
    (pull,) = engine.queues.list_jobs(queue="knowledge.sync")
    assert (pull.status, pull.key, pull.processed_units) == (
        JobStatus.COMPLETED,
        f"connection-{connection.id}",
        4,
    )
    dead = engine.queues.list_jobs(queue="knowledge.dead")
    assert [(j.origin_queue, j.payload["name"], j.attempts) for j in dead] == [
        (INGEST, "scan.broken", 2)
    ]
    error = admin.execute(
        "SELECT error FROM knowledge_documents WHERE name = 'scan.broken'"
    ).fetchone()["error"]
    assert error == "ValueError: cannot parse scan.broken"
    indexed = admin.execute("SELECT sum(indexed_times) AS n FROM knowledge_documents").fetchone()
    assert indexed["n"] == 3  # each good document indexed once
    departments = engine.queues.list_jobs(queue=DEPARTMENT)
    assert sorted(j.key or "" for j in departments) == ["sales", "support"]
