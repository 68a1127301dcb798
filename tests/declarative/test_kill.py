"""A worker process killed (SIGKILL) in the middle of a declared provider's table: the next
attempt resumes the listing at the position saved with the last committed batch, and the run
ends with what an uninterrupted sync makes of the same data. The worker process has no Python
for the provider: it loads the file from the database."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.testing import run_sync
from tests.conftest import make_settings
from tests.test_fencing import spawn_worker

pytestmark = pytest.mark.slow

FILE = Path(__file__).resolve().parent.parent.parent / "examples" / "declarative" / "simulated.yaml"


@pytest.fixture
def simulation() -> Simulation:
    return Simulation()


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def stored(engine: Engine, connection_id: int, table: str) -> dict[str, Any]:
    return {
        r.external_id: (r.data, r.deleted_at is not None)
        for r in engine.records(connection_id, table, include_deleted=True, limit=100_000)
    }


def pages(log: list[str]) -> list[int]:
    found = []
    for entry in log:
        if entry.startswith("issues?"):
            query = dict(p.split("=") for p in entry.split("?", 1)[1].split("&"))
            found.append(int(query.get("page", "1")))
    return found


def test_a_worker_killed_mid_table_resumes_at_its_position(
    schema: str, server: str, simulation: Simulation
) -> None:
    big = simulation.add_tenant("big", size=300, seed=5)
    settings = make_settings(schema, lease_seconds=30.0, batch_size=10)
    with Engine(settings) as engine:
        engine.migrate()
        engine.add_provider(FILE.read_text())
        ws = engine.create_workspace("sim")
        config = {"base_url": server, "tenant": "big", "page_size": 10}
        killed_id, calm_id = (
            engine.create_connection(
                ws.id, name, "declared_simulated", config=config, credentials={"token": "sim-big"}
            ).id
            for name in ("killed", "calm")
        )
        for conn_id in (killed_id, calm_id):
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
            assert reached.wait(120), "the worker never reached page 12"
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(30)
        finally:
            killed.set()
            worker.kill()
            worker.communicate(timeout=30)
        big.on_change("issues", None)
        with engine.pool.connection() as conn:
            saved = conn.execute(
                "SELECT position FROM run_checkpoints WHERE run_id = %s AND table_name = 'issues'",
                (run.id,),
            ).fetchone()
            resume_at = pages([saved["position"]["page"]["next"].split("/")[-1]])[0]
            conn.execute(  # the lease runs out (the test is the clock)
                "UPDATE connection_runs SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = %s",
                (run.id,),
            )

        big.log.clear()
        assert engine.worker(listen=False).poll()
        done = engine.run(run.id)
        assert done.status == "succeeded", done.error
        assert [a.outcome for a in engine.attempts(run.id)] == ["lost", "succeeded"]
        after_kill = pages(big.log)
        assert resume_at >= 11 and after_kill[0] == resume_at  # not from the start
        assert len([p for p in after_kill if p < resume_at]) <= 1

        assert run_sync(engine, calm_id).status == "succeeded"
        for table in ("projects", "issues"):
            assert stored(engine, killed_id, table) == stored(engine, calm_id, table)
        assert any(gone for _, gone in stored(engine, killed_id, "issues").values())
