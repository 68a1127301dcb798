"""Every store repeats a statement the server refused for a passing reason (a deadlock: it rolled
the statement back) through the one RetryPolicy: the application queues' completions and
declarations, an ingestion's batch (its fence, checkpoint and chunks, one transaction) and a
retention batch. The refusal is Postgres's own, raised once by a trigger on the real tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from sync import Engine
from sync.queues import JobStatus, queue_spec
from sync.queues.kind import Completions
from sync.queues.postgres import PostgresQueues
from sync.store.maintenance import MaintenanceStore
from tests.ingestion_support import chunk_count, worker_with, write_text


def deadlock_once(admin: psycopg.Connection[Any], table: str, event: str) -> None:
    """The next statement that does ``event`` (INSERT, UPDATE, DELETE) to ``table`` fails with a
    deadlock; later ones run. A sequence counts the statements: nextval is never rolled back."""
    admin.execute("CREATE SEQUENCE deadlocks")
    admin.execute(
        """
        CREATE FUNCTION deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('deadlocks') = 1 THEN
                RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
            END IF;
            RETURN NULL;
        END $$
        """
    )
    admin.execute(
        f"CREATE TRIGGER deadlock_once BEFORE {event} ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION deadlock_once()"
    )


def tries(admin: psycopg.Connection[Any]) -> int:
    """How many statements met the trigger."""
    row = admin.execute("SELECT last_value FROM deadlocks").fetchone()
    assert row is not None
    return int(row["last_value"])


def test_completions_are_written_after_a_deadlock(engine: Engine, admin: Any) -> None:
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.ingest"))
    queues.register("docs.ingest", lambda job, abort: None)
    ids = [queues.send("docs.ingest", {"doc": n}) for n in range(2)]
    attempts = queues.claim(["docs.ingest"], 2)
    deadlock_once(admin, "jobs", "UPDATE")

    completions = Completions(queues)
    try:
        completions.submit_many(attempts)
        assert completions.flushed.wait_for(1)
    finally:
        completions.stop()
    assert all(queues.get_job(i).status is JobStatus.COMPLETED for i in ids)
    assert tries(admin) == 2


def test_a_queue_declaration_is_repeated_whole_after_a_deadlock(engine: Engine, admin: Any) -> None:
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.dead"))
    deadlock_once(admin, "job_queues", "INSERT")
    declared = queues.declare_queue(queue_spec("docs.ingest", dead_letter="docs.dead"))
    assert declared.dead_letter == "docs.dead"
    assert queues.get_queue("docs.ingest") == declared
    assert tries(admin) == 2


def test_an_ingestion_batch_is_repeated_whole_after_a_deadlock_in_the_same_attempt(
    engine: Engine, admin: Any, tmp_path: Path
) -> None:
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "a.txt", paragraphs=3)
    ingestion = engine.ingest(path, ws.id)
    deadlock_once(admin, "document_chunks", "INSERT")
    worker = worker_with(engine)
    try:
        assert worker.poll()
    finally:
        worker.close()
    done = engine.ingestion(ingestion.id)
    assert (done.status, done.attempts) == ("ready", 1)  # not failed, nor retried later
    assert done.processed_units == done.total_units == chunk_count(path)
    stored = admin.execute(
        "SELECT count(*) AS n FROM document_chunks WHERE document_id = %s", (done.document_id,)
    ).fetchone()
    assert stored["n"] == chunk_count(path) and tries(admin) == 2


def test_a_retention_batch_is_repeated_after_a_deadlock(engine: Engine, admin: Any) -> None:
    admin.execute(
        "INSERT INTO rate_budgets (key, blocked_until, reason) "
        "VALUES ('spent', now() - interval '1 hour', 'a 429')"
    )
    deadlock_once(admin, "rate_budgets", "DELETE")
    batch = MaintenanceStore(engine.pool).prune_rate_budgets(limit=10, delete=True)
    assert (batch.found, batch.deleted) == (1, 1)
    assert tries(admin) == 2
