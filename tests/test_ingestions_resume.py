"""A `connector-sync worker` killed with SIGKILL after k batches of a document: another worker
resumes the ingestion at batch k, at most one batch is embedded twice, and the chunks are those
of an uninterrupted ingestion, byte for byte.

The test holds the first attempt at a known point without a clock: a trigger on the ingestion
row makes that attempt's checkpoint of batch k + 1 wait for an advisory lock the test holds, so
exactly k batches are committed when the worker logs that it embedded batch k + 1; then the test
kills it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sync import Engine
from tests.cli_backends import SCRIPT, WorkerProcess
from tests.conftest import DATABASE_URL, make_settings
from tests.ingestion_support import (
    CountingEmbedder,
    chunk_count,
    drain,
    stored_chunks,
    worker_with,
    write_text,
)

BATCH = 200
K = 3  # batches committed before the kill
LOCK = 4242

HOLD_AFTER_K = f"""
CREATE FUNCTION hold_first_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.attempts = 1 AND NEW.processed_units > {K * BATCH} THEN
        PERFORM pg_advisory_xact_lock({LOCK});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_first_attempt BEFORE UPDATE OF processed_units ON ingestions
    FOR EACH ROW EXECUTE FUNCTION hold_first_attempt();
"""


@pytest.mark.slow
def test_a_killed_worker_is_resumed_at_its_last_batch_and_the_chunks_are_the_same(
    schema: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = write_text(tmp_path / "site-walk.txt", paragraphs=1300)
    total = chunk_count(path)
    assert total > (K + 2) * BATCH
    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        admin.execute(HOLD_AFTER_K)
        killed_ws = engine.create_workspace("killed")
        calm_ws = engine.create_workspace("calm")
        ingestion = engine.ingest(path, killed_ws.id)

        with psycopg.connect(DATABASE_URL, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
            env = {
                **os.environ,
                "DATABASE_URL": DATABASE_URL,
                "CONNECTOR_SYNC_SCHEMA": schema,
                "CONNECTOR_SYNC_POLL_INTERVAL": "0.2",
            }
            worker = WorkerProcess(
                subprocess.Popen(
                    [str(SCRIPT), "worker"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            )
            try:
                first, last = K * BATCH, (K + 1) * BATCH - 1
                assert worker.wait_for(f"embedded chunks {first}-{last} ", timeout=120), worker.log
                os.kill(worker.pid, signal.SIGKILL)
            finally:
                worker.stop(signal.SIGKILL)
            # Its connection's backend, still waiting to write batch k + 1, goes too (as its TCP
            # keepalive would end it), and the test, as the clock, lets the lease run out.
            holder.execute(
                "SELECT pg_terminate_backend(pid, 30000) FROM pg_locks "
                "WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
                (LOCK,),
            )
        killed = engine.ingestion(ingestion.id)
        assert killed.status == "running" and killed.processed_units == K * BATCH
        assert killed.total_units == total
        admin.execute(
            "UPDATE ingestions SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (ingestion.id,),
        )
        killed_embedded = BATCH * sum("embedded chunks" in line for line in worker.lines)

        # Another worker takes it over and resumes at batch k.
        counting = CountingEmbedder()
        resumer = worker_with(engine, counting)
        try:
            assert resumer.poll()
            done = engine.ingestion(ingestion.id)
            assert done.status == "ready", done.error
            assert done.attempts == 2 and done.processed_units == total
            assert counting.embedded == total - K * BATCH  # nothing before batch k again
            assert (
                counting.first_texts[0] == stored_chunks(admin, done.document_id or 0)[K * BATCH][2]
            )
            # Embedded twice: the batch the killed worker embedded but never committed, at most.
            twice = killed_embedded + counting.embedded - total
            assert 0 <= twice <= BATCH, (killed_embedded, counting.embedded, total)

            # The same file, ingested without interruption in another workspace.
            calm = engine.ingest(path, calm_ws.id)
            drain(resumer)
            calm = engine.ingestion(calm.id)
            assert calm.status == "ready" and calm.attempts == 1
        finally:
            resumer.close()
        resumed_chunks = stored_chunks(admin, done.document_id or 0)
        assert len(resumed_chunks) == total
        assert resumed_chunks == stored_chunks(admin, calm.document_id or 0)
        assert [r[0] for r in resumed_chunks] == list(range(total))
