"""Applications of the application queues for tests, loaded by worker processes with
``connector-sync worker --app tests.queue_apps:crash`` (or in-process by the tests).

``crash``: queue ``probe.crash``; its handler records each attempt's start and each
completion in the table ``probe_runs`` of the schema, and blocks in its first attempt (until its
abort signal trips), so a test can kill the worker mid-job.

``sweep``: queue ``probe.sweep`` and its cron schedule, declared at each start."""

from __future__ import annotations

import os

import psycopg

from sync.queues import Abort, Job, Queues, queue_spec

PROBE_TABLE = """
CREATE TABLE IF NOT EXISTS probe_runs (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    what text NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
)"""


def _record(job: Job, what: str) -> None:
    # One transaction, its search_path local to it: DATABASE_URL may be a transaction pooler.
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute(f"SET LOCAL search_path TO {os.environ['CONNECTOR_SYNC_SCHEMA']}")
        conn.execute(PROBE_TABLE)
        conn.execute(
            "INSERT INTO probe_runs (job_id, attempt, what, pid) VALUES (%s, %s, %s, %s)",
            (job.id, job.attempts, what, os.getpid()),
        )


def crash(queues: Queues) -> None:
    queues.declare_queue(queue_spec("probe.crash", expire=60, retry_limit=2))

    def handler(job: Job, abort: Abort) -> None:
        _record(job, "started")
        if job.attempts == 1:
            abort.wait(3600)  # the worker is killed here
            raise RuntimeError("the first attempt was told to stop")
        _record(job, "completed")

    queues.register("probe.crash", handler)


SWEEP = "probe.sweep"


def sweep(queues: Queues) -> None:
    """``probe.sweep``, swept every five minutes: declared at every start, as an application
    declares its queues and schedules in its ``setup``."""
    queues.declare_queue(queue_spec(SWEEP))
    queues.schedule(SWEEP, "*/5 * * * *")
    queues.register(SWEEP, lambda job, abort: None)
