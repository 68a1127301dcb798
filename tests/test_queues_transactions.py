"""What only Postgres can show of a send in the application's own transaction: the wake-up
notification goes out when the transaction commits (and never if it rolls back), with the
application's connection, sync or async, left as it was; and the statements run on such a
connection prepare with the schema named."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from sync import Engine
from sync.queues import QueuePolicy, queue_spec
from sync.queues.postgres_async import AsyncPostgresQueues
from sync.store.queries import parse
from sync.store.sqlfiles import sql_dir
from tests.conftest import DATABASE_URL, DIRECT_URL
from tests.queues_contract import in_thread
from tests.waiting import wait_until_blocked

WAKE = "job:docs.ingest"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class Wakeups:
    """A LISTEN on the engine's channel. :meth:`before_probe` reads the notifications delivered
    before a probe sent now (Postgres delivers them in commit order), so a test sees what has
    been sent so far without waiting for the clock."""

    def __init__(self, schema: str) -> None:
        self.conn = psycopg.connect(DIRECT_URL, autocommit=True)
        row = self.conn.execute(
            sql.SQL("SELECT {}.notify_channel()").format(sql.Identifier(schema))
        ).fetchone()
        assert row is not None
        self.channel = row[0]
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    def before_probe(self) -> list[str]:
        with psycopg.connect(DIRECT_URL, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, 'probe')", (self.channel,))
        seen = []
        for note in self.conn.notifies(timeout=30):
            if note.payload == "probe":
                return seen
            seen.append(note.payload)
        raise AssertionError("the probe never came back")


@pytest.fixture
def wakeups(engine: Engine) -> Iterator[Wakeups]:
    listening = Wakeups(engine.settings.schema_name)
    yield listening
    listening.conn.close()


def test_the_notification_of_a_send_goes_out_at_commit(engine: Engine, wakeups: Wakeups) -> None:
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    with psycopg.connect(DATABASE_URL) as app:
        app.execute("SET search_path = public")
        job_id = engine.queues.send("docs.ingest", {"doc": 1}, conn=app)
        # The application's connection is left as it was, read in the same transaction: behind
        # PgBouncer's transaction pooling the next one may run on another server connection.
        row = app.execute("SHOW search_path").fetchone()
        assert row is not None and row[0] == "public"
        assert wakeups.before_probe() == []
        app.commit()
        assert wakeups.before_probe() == [WAKE]
    assert engine.queues.get_job(job_id).payload == {"doc": 1}


def test_a_rolled_back_send_notifies_nothing(engine: Engine, wakeups: Wakeups) -> None:
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    with psycopg.connect(DATABASE_URL) as app:
        engine.queues.send_many("docs.ingest", [1, 2], conn=app)
        app.rollback()
    assert wakeups.before_probe() == []
    assert engine.queues.list_jobs() == []


def test_an_async_send_on_the_applications_connection_notifies_at_commit(
    engine: Engine, wakeups: Wakeups
) -> None:
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    schema = engine.settings.schema_name

    async def scenario() -> tuple[list[str], list[str], int]:
        async with AsyncConnectionPool(DATABASE_URL, open=False, min_size=1) as pool:
            queues = AsyncPostgresQueues(pool, schema=schema)
            async with pool.connection() as app:
                async with app.transaction():
                    job_id = await queues.send("docs.ingest", {"doc": 2}, conn=app)
                    before = await asyncio.to_thread(wakeups.before_probe)
                after = await asyncio.to_thread(wakeups.before_probe)
            return before, after, job_id

    before, after, job_id = asyncio.run(scenario())
    assert (before, after) == ([], [WAKE])
    assert engine.queues.get_job(job_id).payload == {"doc": 2}


def test_a_delayed_send_in_a_transaction_wakes_no_one(engine: Engine, wakeups: Wakeups) -> None:
    """A job not due yet wakes no lane when it commits: the poll finds it when it is due."""
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    with psycopg.connect(DATABASE_URL) as app:
        engine.queues.send("docs.ingest", {}, start_after=timedelta(minutes=5), conn=app)
        app.commit()
    assert wakeups.before_probe() == []
    assert len(engine.queues.list_jobs()) == 1


def test_every_statement_run_on_a_callers_connection_prepares(engine: Engine, admin: Any) -> None:
    schema = engine.settings.schema_name
    admin.execute("SET search_path = public")
    for name, query in parse((sql_dir() / "queues_caller.sql").read_text()).items():
        params = sorted(set(_PLACEHOLDER.findall(query.text)))
        numbered = _PLACEHOLDER.sub(lambda m, p=params: f"${p.index(m.group(1)) + 1}", query.text)
        text = sql.SQL(numbered).format(schema=sql.Identifier(schema)).as_string(admin)  # type: ignore[arg-type]
        admin.execute(f"PREPARE check_{name} AS {text}")
        admin.execute(f"DEALLOCATE check_{name}")


def test_in_repeatable_read_a_send_that_waited_for_a_key_fails_to_serialize(
    engine: Engine,
) -> None:
    """The waiting rule is READ COMMITTED's: a REPEATABLE READ transaction that waited for the
    key another transaction committed cannot see that job, and gets a serialization failure
    (which the application retries), never a second job."""
    engine.queues.declare_queue(queue_spec("sources.sync", policy=QueuePolicy.EXCLUSIVE))
    schema = engine.settings.schema_name
    named = {"application_name": f"connector-sync/{schema}"}  # seen by wait_until_blocked
    failures: list[BaseException] = []
    with psycopg.connect(DATABASE_URL) as holder, psycopg.connect(DATABASE_URL, **named) as app:
        app.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        app.execute("SELECT 1")  # the transaction's snapshot, before the holder commits
        first = engine.queues.send("sources.sync", {}, key="source-7", conn=holder)

        def send() -> None:
            try:
                engine.queues.send("sources.sync", {}, key="source-7", conn=app)
            except psycopg.errors.SerializationFailure as exc:
                failures.append(exc)

        with in_thread(send):
            wait_until_blocked(schema)
            holder.commit()
        app.rollback()
    assert len(failures) == 1
    assert [job.id for job in engine.queues.list_jobs()] == [first]
