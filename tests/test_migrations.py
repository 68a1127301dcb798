"""Migrations: idempotent, safe from two processes at once, checksummed; the worker refuses a
schema that is behind; `grant` gives a runtime role data rights and no DDL rights."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sync import Engine, MigrationError, SchemaBehind
from sync.store.migrations import _lock_key, migrate, shipped
from tests.conftest import DATABASE_URL, DIRECT_URL, make_settings
from tests.waiting import wait_until_blocked


def test_migrate_is_idempotent_and_records_checksums(schema: str, admin: Any) -> None:
    with Engine(make_settings(schema)) as engine:
        first = engine.migrate()
        assert [m.version for m in first] == [m.version for m in shipped()]
        assert engine.migrate() == []
        engine.check_schema()
    rows = admin.execute(
        "SELECT version, name, checksum FROM schema_migrations ORDER BY 1"
    ).fetchall()
    assert [(r["version"], r["checksum"]) for r in rows] == [
        (m.version, m.checksum) for m in shipped()
    ]


@pytest.mark.slow
def test_two_processes_migrating_at_once_apply_each_file_once(schema: str, admin: Any) -> None:
    script = (
        "import sys; sys.path.insert(0, '.')\n"
        "from sync import Engine\n"
        "from tests.conftest import make_settings\n"
        "with Engine(make_settings(sys.argv[1])) as e:\n"
        "    print(len(e.migrate()))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    # Each migration's transaction takes the lock: the processes may share the work, but every
    # file is applied by one of them, once, after the file before it committed.
    assert sum(int(out) for out, _ in results) == len(shipped())
    rows = admin.execute("SELECT version FROM schema_migrations ORDER BY applied_at").fetchall()
    assert [r["version"] for r in rows] == [m.version for m in shipped()]


def test_an_edited_migration_is_an_error(schema: str, admin: Any) -> None:
    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        admin.execute("UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
        edited = r"0001_baseline\.sql was edited after it was applied"
        with pytest.raises(MigrationError, match=edited):
            engine.migrate()
        with pytest.raises(MigrationError, match=edited):
            engine.worker()


def test_a_schema_migrated_by_another_build_is_an_error(schema: str, admin: Any) -> None:
    """A schema whose migration 1 is another file (made by a build from before the baseline,
    whose migrations were numbered differently) is refused by name, before any checksum."""
    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        admin.execute(
            "UPDATE schema_migrations SET name = 'schema', checksum = 'x' WHERE version = 1"
        )
        other = r"migrated by another build .*0001_schema\.sql, not 0001_baseline\.sql"
        with pytest.raises(MigrationError, match=other):
            engine.migrate()
        with pytest.raises(MigrationError, match=other):
            engine.worker()


def test_the_worker_refuses_a_schema_that_is_behind(schema: str, admin: Any) -> None:
    with Engine(make_settings(schema)) as engine:
        with pytest.raises(SchemaBehind, match="run `connector-sync migrate`"):
            engine.worker()
        engine.migrate()
        last = shipped()[-1].version
        admin.execute("DELETE FROM schema_migrations WHERE version = %s", (last,))
        with pytest.raises(SchemaBehind, match=r"behind .*run `connector-sync migrate`"):
            engine.worker()


@pytest.fixture
def runtime_role() -> Any:
    role = f"cs_runtime_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_grant_gives_data_rights_and_no_ddl(schema: str, runtime_role: str) -> None:
    from tests.fakes import DATASETS, Dataset

    DATASETS["granted"] = Dataset(tables={"items": [{"id": 1}]})
    with Engine(make_settings(schema)) as owner:
        owner.migrate()
        owner.grant(runtime_role)
    url = psycopg.conninfo.make_conninfo(DATABASE_URL, user=runtime_role)
    with Engine(make_settings(schema, database_url=url)) as engine:
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "c", "memory", config={"dataset": "granted"})
        run = engine.sync(conn.id)
        assert engine.worker(listen=False).poll()
        assert engine.run(run.id).status == "succeeded"
        assert engine.delete_connection(conn.id).kind == "purge"
        assert engine.worker(listen=False).poll()
        with engine.pool.connection() as db:
            for ddl in (
                "CREATE TABLE sneaky (id int)",
                "ALTER TABLE records ADD COLUMN sneaky int",
                "DROP TABLE records",
                "CREATE INDEX sneaky ON records (data)",
                "TRUNCATE records",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    db.execute(ddl)
        with pytest.raises(MigrationError):
            engine.migrate()


def test_a_migrate_that_waited_while_another_created_the_schema_goes_on(schema: str) -> None:
    """The migrate that waits on the lock began its transaction before the other one committed
    the schema, on a server connection that had looked the schema up while it did not exist
    (behind a pooler, another client's search path does) and had checked a CREATE SCHEMA's
    rights before. Taking an advisory lock does not make Postgres read the catalog changes
    committed meanwhile, so its CREATE SCHEMA IF NOT EXISTS tried to create the schema again."""
    with (
        psycopg.connect(
            DIRECT_URL, autocommit=True, application_name=f"connector-sync/{schema}"
        ) as waiter,
        psycopg.connect(DIRECT_URL, autocommit=True) as holder,
    ):
        waiter.execute("CREATE SCHEMA IF NOT EXISTS public")
        assert waiter.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_lock_key(schema),))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["applied"] = migrate(waiter, schema)
            except Exception as exc:  # reported by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        wait_until_blocked(schema)
        holder.execute(f"CREATE SCHEMA {schema}")
        holder.execute("COMMIT")
        thread.join()
    assert "error" not in outcome, outcome
    assert [m.version for m in outcome["applied"]] == [m.version for m in shipped()]
