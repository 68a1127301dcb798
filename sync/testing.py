"""Test a connector through the engine, against a real Postgres, in a few lines.

Add ``pytest_plugins = ["sync.testing"]`` to your ``conftest.py``; set ``DATABASE_URL`` (each
test gets a schema of its own there, dropped afterwards). Then::

    def test_first_sync(sync_engine, respx_mock):
        respx_mock.get(...).mock(...)
        ws = sync_engine.create_workspace("test")
        conn = sync_engine.create_connection(ws.id, "c", "my-provider", config={...})
        run = run_sync(sync_engine, conn.id)
        assert run.status == "succeeded"
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from sync.api import Engine
from sync.base.settings import Settings
from sync.models import Run
from sync.vocabulary import RunStatus
from sync.worker import Worker

DEFAULT_TEST_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"


def run_sync(
    engine: Engine,
    connection_id: int,
    *,
    worker: Worker | None = None,
    skip_retry_waits: bool = True,
    max_polls: int = 20,
) -> Run:
    """Queue a sync of ``connection_id`` (or take the one already queued) and poll a worker
    until the run ends. With ``skip_retry_waits`` a run requeued for a retry or waiting for a
    rate limit is made due at once (:func:`make_run_due`), so retries and waits happen without
    sleeping; without it, the run is returned as soon as it is requeued."""
    run = engine.sync(connection_id)
    worker = worker or engine.worker(listen=False)
    for _ in range(max_polls):
        worker.poll()
        run = engine.run(run.id)
        if run.is_terminal:
            return run
        if run.status == RunStatus.QUEUED and (run.attempts > 0 or run.waits > 0):
            if not skip_retry_waits:
                return run
            make_run_due(engine, run.id)
    raise AssertionError(f"run {run.id} did not end in {max_polls} polls: {run.status}")


def make_run_due(engine: Engine, run_id: int) -> bool:
    """Let a requeued run's time come now: due at once, and the rate budget it waits for free
    again, as if the provider's reset had come. False if the run was not waiting."""
    return engine.store.make_due(run_id)


@pytest.fixture
def sync_engine() -> Iterator[Engine]:
    """An Engine on a fresh, migrated schema of ``DATABASE_URL``, dropped after the test."""
    url = os.environ.get("DATABASE_URL", DEFAULT_TEST_DATABASE)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    key = os.environ.get("CONNECTOR_SYNC_SECRET_KEYS") or Fernet.generate_key().decode()
    # The schemas of its connections' typed views are named after it, and dropped with it.
    settings = Settings(
        database_url=url,
        schema_name=schema,
        secret_keys=SecretStr(key),
        reader_schema_prefix=f"{schema}_",
    )
    try:
        with Engine(settings) as engine:
            engine.migrate()
            yield engine
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            readers = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (f"{schema}_",)
            ).fetchall()
            for name in [schema, *(r[0] for r in readers)]:
                conn.execute(
                    psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        psycopg.sql.Identifier(name)
                    )
                )


@pytest.fixture
def sync_worker(sync_engine: Engine) -> Worker:
    """A worker on ``sync_engine``; call ``poll()`` to run one stage loop."""
    return sync_engine.worker(listen=False)
