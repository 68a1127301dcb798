"""An application that defers its own work to the application queues, on the same worker fleet
that runs connection syncs:

| queue | carries | policy |
| --- | --- | --- |
| ``knowledge.ingest`` | one document | standard: many at once |
| ``knowledge.ingest.sweep`` | nothing; cron queues pending documents | exclusive |
| ``knowledge.sync`` | one source (a connection) to pull | exclusive per source |
| ``knowledge.sync.sweep`` | nothing; cron queues sources not synced for a while | exclusive |
| ``gateway.department.sync`` | one department to reconcile | exclusive per department |

A *source* is a connection of the engine. Pulling one (``knowledge.sync``) asks the engine for a
sync (``Engine.sync``), waits for the run, and registers one *document* per synced record; the
ingest sweep queues each pending document to ``knowledge.ingest``, whose handler "indexes" it
(a document whose name ends in ``.broken`` cannot be parsed: after its retries its job is dead
and the ``on_dead`` hook marks the document failed where a person sees it). A *department* is a
row reconciled by ``gateway.department.sync``. The documents and departments are this
application's own tables, ``knowledge_documents`` and ``gateway_departments``.

Run it on a worker with::

    CONNECTOR_SYNC_LANES="knowledge.ingest=4,knowledge.ingest.sweep=1,knowledge.sync=1,\\
    knowledge.sync.sweep=1,gateway.department.sync=2" \\
        connector-sync worker --app examples.knowledge.app:setup
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from sync import Engine
from sync.queues import Abort, Job, QueuePolicy, Queues, queue_spec

INGEST = "knowledge.ingest"
INGEST_SWEEP = "knowledge.ingest.sweep"
SYNC = "knowledge.sync"
SYNC_SWEEP = "knowledge.sync.sweep"
DEPARTMENT = "gateway.department.sync"
DEAD = "knowledge.dead"
# A source whose last sync finished longer ago than this is pulled again by the sync sweep.
STALE_AFTER = timedelta(minutes=30)

TABLES = """
CREATE TABLE IF NOT EXISTS knowledge_documents (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    connection_id bigint NOT NULL,
    name text NOT NULL,
    status text NOT NULL DEFAULT 'pending',  -- pending | queued | indexed | failed
    error text,
    indexed_times integer NOT NULL DEFAULT 0,
    UNIQUE (connection_id, name)
);
CREATE TABLE IF NOT EXISTS gateway_departments (
    name text PRIMARY KEY,
    reconciled_times integer NOT NULL DEFAULT 0,
    reconciled_at timestamptz
);
"""


class Knowledge:
    """The application: its queues, its handlers, its tables, on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.queues: Queues = engine.queues
        with engine.pool.connection() as conn:
            conn.execute(TABLES)

    def declare(self, queues: Queues) -> None:
        queues.declare_queue(queue_spec(DEAD, retention=30 * 86400))
        # Short retries so that a broken document is marked failed within seconds here.
        queues.declare_queue(
            queue_spec(INGEST, retry_limit=1, retry_delay=1, retry_ceiling=5, dead_letter=DEAD)
        )
        queues.declare_queue(queue_spec(INGEST_SWEEP, policy=QueuePolicy.EXCLUSIVE))
        queues.declare_queue(queue_spec(SYNC, policy=QueuePolicy.EXCLUSIVE, expire=3600))
        queues.declare_queue(queue_spec(SYNC_SWEEP, policy=QueuePolicy.EXCLUSIVE))
        queues.declare_queue(queue_spec(DEPARTMENT, policy=QueuePolicy.EXCLUSIVE))
        queues.schedule(INGEST_SWEEP, "* * * * *")
        queues.schedule(SYNC_SWEEP, "*/5 * * * *")

    def register(self, queues: Queues) -> None:
        self.queues = queues
        queues.register(INGEST, self.ingest, on_dead=self.mark_failed)
        queues.register(INGEST_SWEEP, lambda job, abort: self.sweep_documents())
        queues.register(SYNC, self.pull_source)
        queues.register(SYNC_SWEEP, lambda job, abort: self.sweep_sources())
        queues.register(DEPARTMENT, self.reconcile_department)

    # What the application asks for

    def pull(self, connection_id: int) -> int:
        key = f"connection-{connection_id}"
        return self.queues.send(SYNC, {"connection": connection_id}, key=key)

    def reconcile(self, department: str) -> int:
        return self.queues.send(DEPARTMENT, {"department": department}, key=department)

    def add_departments(self, *names: str) -> None:
        with self.engine.pool.connection() as conn:
            for name in names:
                conn.execute(
                    "INSERT INTO gateway_departments (name) VALUES (%s) ON CONFLICT DO NOTHING",
                    (name,),
                )

    # Handlers

    def sweep_sources(self) -> None:
        """Pull every active source whose last sync is older than STALE_AFTER (or that never
        synced). The pull is exclusive per source, so a source already pending is not queued
        twice."""
        for connection in self.engine.connections():
            if connection.status != "active":
                continue
            runs = self.engine.runs(connection_id=connection.id, limit=1)
            last = runs[0].finished_at if runs else None
            if runs and runs[0].status in ("queued", "running", "waiting"):
                continue
            if last is None or last < _now(self.engine) - STALE_AFTER:
                self.pull(connection.id)

    def pull_source(self, job: Job, abort: Abort) -> None:
        """Sync the source now (or join the sync already under way), wait for it, and register
        a document per synced record; the ingest sweep is asked to queue them."""
        connection_id = int(job.payload["connection"])
        run = self.engine.sync(connection_id, trigger="knowledge.sync")
        while run.status in ("waiting", "queued", "running"):
            if abort.wait(0.2):
                raise RuntimeError(f"stopped while sync run #{run.id} was {run.status}")
            run = self.engine.run(run.id)
        if run.status not in ("succeeded", "partial"):
            raise RuntimeError(f"sync run #{run.id} ended {run.status}")
        records = self.engine.records(connection_id)
        names = [str(r.data.get("title") or r.external_id) for r in records]
        with self.engine.pool.connection() as conn:
            for name in names:
                conn.execute(
                    "INSERT INTO knowledge_documents (connection_id, name) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (connection_id, name),
                )
        abort.report_progress(len(names), len(names))
        self.queues.send(INGEST_SWEEP, None)

    def sweep_documents(self) -> None:
        """Queue every pending document for ingestion, once."""
        with self.engine.pool.connection() as conn:
            pending = conn.execute(
                "UPDATE knowledge_documents SET status = 'queued' WHERE status = 'pending' "
                "RETURNING id, name"
            ).fetchall()
        for row in pending:
            self.queues.send(INGEST, {"document": row["id"], "name": row["name"]})

    def ingest(self, job: Job, abort: Abort) -> None:
        if str(job.payload["name"]).endswith(".broken"):
            raise ValueError(f"cannot parse {job.payload['name']}")
        with self.engine.pool.connection() as conn:
            conn.execute(
                "UPDATE knowledge_documents SET status = 'indexed', error = NULL, "
                "indexed_times = indexed_times + 1 WHERE id = %s",
                (job.payload["document"],),
            )

    def mark_failed(self, job: Job) -> None:
        with self.engine.pool.connection() as conn:
            conn.execute(
                "UPDATE knowledge_documents SET status = 'failed', error = %s WHERE id = %s",
                (job.error, job.payload["document"]),
            )

    def reconcile_department(self, job: Job, abort: Abort) -> None:
        with self.engine.pool.connection() as conn:
            conn.execute(
                "UPDATE gateway_departments SET reconciled_times = reconciled_times + 1, "
                "reconciled_at = now() WHERE name = %s",
                (job.payload["department"],),
            )


def _now(engine: Engine) -> Any:
    with engine.pool.connection() as conn:
        row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]


_app: Knowledge | None = None
_app_lock = threading.Lock()


def setup(queues: Queues) -> None:
    """The worker's entry (``--app examples.knowledge.app:setup``): the application on an
    engine of its own (DATABASE_URL, CONNECTOR_SYNC_SCHEMA), its queues declared and its
    handlers registered on ``queues``."""
    global _app
    with _app_lock:
        if _app is None:
            _app = Knowledge(Engine())
    _app.declare(queues)
    _app.register(queues)
