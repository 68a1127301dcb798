"""The worked example of docs/queues.md, a document stored and its ingestion queued in one
transaction on an async pool, runs as written on the real Postgres: both commit, or, when the
document's insert fails, neither exists."""

from __future__ import annotations

import asyncio
import re
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from sync import Engine
from sync.queues import queue_spec
from sync.queues.postgres_async import AsyncPostgresQueues
from tests.conftest import DATABASE_URL, DIRECT_URL, direct_only

DOC = Path(__file__).parent.parent / "docs" / "queues.md"
BLOCK = re.compile(r"```python\n# documents\.py\n(.*?)```", re.DOTALL)


def documents_module() -> types.ModuleType:
    found = BLOCK.search(DOC.read_text())
    assert found, "docs/queues.md has no documents.py example"
    module = types.ModuleType("documents")
    exec(compile(found.group(1), "documents.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def app_schema() -> Iterator[str]:
    """The application's own schema, with its documents table; the engine's is apart."""
    name = f"app_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(
            f"CREATE TABLE {name}.documents (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " title text NOT NULL CHECK (title <> ''))"
        )
    yield name
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


@direct_only("the application's pool sets its search_path as a startup option")
def test_the_document_and_its_job_commit_together_or_not_at_all(
    engine: Engine, app_schema: str
) -> None:
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    upload = documents_module().upload
    schema = engine.settings.schema_name

    async def scenario() -> tuple[dict[str, int], BaseException | None]:
        async with AsyncConnectionPool(
            DATABASE_URL, open=False, kwargs={"options": f"-c search_path={app_schema}"}
        ) as pool:
            queues = AsyncPostgresQueues(pool, schema=schema)
            stored = await upload(pool, queues, "handbook")
            failed: BaseException | None = None
            try:
                await upload(pool, queues, "")
            except psycopg.errors.CheckViolation as exc:
                failed = exc
            return stored, failed

    stored, failed = asyncio.run(scenario())
    assert failed is not None
    job = engine.queues.get_job(stored["job"])
    assert (job.payload, job.priority) == ({"document": stored["document"]}, 1)
    assert len(engine.queues.list_jobs()) == 1  # the failed upload left no job
    with psycopg.connect(DIRECT_URL) as conn:
        rows: list[Any] = conn.execute(f"SELECT id, title FROM {app_schema}.documents").fetchall()
    assert rows == [(stored["document"], "handbook")]
