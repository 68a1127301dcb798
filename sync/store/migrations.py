"""Schema migrations: numbered ``sql/NNNN_name.sql`` files applied in order, each in its own
transaction, recorded with a checksum in ``schema_migrations``, serialized between processes by
an advisory lock. Also the schema check the worker runs at start, and ``grant``.

The lock is a transaction-level one (``pg_advisory_xact_lock``), taken again in each migration's
transaction, never held by a session: Postgres releases it with the transaction, so ``migrate``
works the same through a transaction pooler, which may run each transaction on another server
connection, and a ``migrate`` that dies leaves no lock behind."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, LiteralString, cast

import psycopg
from psycopg import sql

from sync.errors import InvalidInput, MigrationError, SchemaBehind
from sync.store.db import first_line
from sync.store.sqlfiles import sql_dir

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str = field(repr=False)

    @cached_property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def filename(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


def shipped() -> list[Migration]:
    """The migrations this installation carries, in order."""
    found = []
    for path in sorted(sql_dir().iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version number in sql/")
    return found


def _lock_key(schema: str) -> str:
    return f"connector_sync.migrate.{schema}"


def _applied(conn: psycopg.Connection[Any], schema: str) -> dict[int, dict[str, Any]] | None:
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL AS present", (f"{schema}.schema_migrations",)
    ).fetchone()
    if not exists or not _field(exists, "present"):
        return None
    rows = conn.execute(
        sql.SQL("SELECT version, name, checksum FROM {}.schema_migrations").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    return {_field(r, "version"): r for r in rows}


def _field(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, dict) else row[0]


def _verify_checksums(
    applied: dict[int, dict[str, Any]], migrations: list[Migration], schema: str
) -> None:
    for m in migrations:
        row = applied.get(m.version)
        if row is not None and row["name"] != m.name:
            raise MigrationError(
                f"schema {schema!r} was migrated by another build of connector-sync (its "
                f"migration {m.version} is {m.version:04d}_{row['name']}.sql, not {m.filename}); "
                "migrate a new schema (CONNECTOR_SYNC_SCHEMA) or drop this one and migrate again"
            )
        if row is not None and row["checksum"] != m.checksum:
            raise MigrationError(
                f"migration {m.filename} was edited after it was applied; restore the original "
                "and put the change in a new numbered migration"
            )


def migrate(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Apply the pending migrations; returns those applied now. Safe to run from many
    processes at once: each migration's transaction takes the advisory lock, so one applies
    it while the others wait, then find it applied and skip it."""
    if not conn.autocommit:
        raise ValueError("migrate() needs an autocommit connection")
    try:
        return _migrate(conn, schema)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MigrationError(
            f"this database role may not change the schema ({first_line(exc)}); run "
            "`connector-sync migrate` as the schema's owner"
        ) from None


def _lock(conn: psycopg.Connection[Any], schema: str) -> None:
    """Serialize the migrations of ``schema`` until this transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_lock_key(schema),))


def _bootstrap(conn: psycopg.Connection[Any], schema: str) -> dict[int, dict[str, Any]]:
    """Create the schema and its ``schema_migrations`` table if missing; return what is applied.

    Taking an advisory lock does not make Postgres read the catalog changes other transactions
    committed while it waited (only relation locks and a transaction's start do). A server
    connection that had already looked the schema up and found it absent (another client's
    search path, behind a pooler) can therefore run CREATE SCHEMA IF NOT EXISTS on a stale
    "absent" after the process it waited for created the schema, and fail with a unique
    violation. The next transaction starts by reading those changes, so one retry settles it."""
    try:
        return _bootstrap_once(conn, schema)
    except (psycopg.errors.UniqueViolation, psycopg.errors.InvalidSchemaName):
        return _bootstrap_once(conn, schema)


def _bootstrap_once(conn: psycopg.Connection[Any], schema: str) -> dict[int, dict[str, Any]]:
    ident = sql.Identifier(schema)
    with conn.transaction():
        _lock(conn, schema)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(sql.SQL(cast(LiteralString, _BOOTSTRAP)).format(schema=ident))
        return _applied(conn, schema) or {}


def _migrate(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    ident = sql.Identifier(schema)
    migrations = shipped()
    applied = _bootstrap(conn, schema)
    _verify_checksums(applied, migrations, schema)
    done = []
    for m in migrations:
        if m.version in applied:
            continue
        with conn.transaction():
            _lock(conn, schema)
            # Another process may have applied it since `applied` was read.
            if _is_applied(conn, schema, m.version):
                continue
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
            try:
                conn.execute(cast(LiteralString, m.text))
            except psycopg.Error as exc:
                raise MigrationError(f"migration {m.filename} failed: {exc}") from exc
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)"
                ).format(ident),
                (m.version, m.name, m.checksum),
            )
        done.append(m)
    return done


def _is_applied(conn: psycopg.Connection[Any], schema: str, version: int) -> bool:
    row = conn.execute(
        sql.SQL("SELECT 1 FROM {}.schema_migrations WHERE version = %s").format(
            sql.Identifier(schema)
        ),
        (version,),
    ).fetchone()
    return row is not None


def check_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Raise :class:`SchemaBehind` unless every shipped migration is applied (the worker never
    migrates). A schema ahead of this code is accepted: migrations only add."""
    migrations = shipped()
    applied = _applied(conn, schema)
    if applied is None:
        raise SchemaBehind(
            f"the database has no connector-sync schema {schema!r}; run `connector-sync migrate`"
        )
    _verify_checksums(applied, migrations, schema)
    missing = [m.filename for m in migrations if m.version not in applied]
    if missing:
        raise SchemaBehind(
            f"the database schema is behind this connector-sync ({len(missing)} migration(s) "
            f"pending, from {missing[0]}); run `connector-sync migrate`"
        )


_GRANTS = (
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
    "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
)


def grant(conn: psycopg.Connection[Any], schema: str, role: str) -> None:
    """Give ``role`` the data rights the API and workers need, and no DDL rights. Run it again
    after every ``migrate`` that adds tables."""
    found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if not found:
        raise InvalidInput(f"role {role!r} does not exist; create it first (CREATE ROLE ... LOGIN)")
    check_schema(conn, schema)
    with conn.transaction():
        for statement in _GRANTS:
            conn.execute(
                sql.SQL(cast(LiteralString, statement)).format(
                    schema=sql.Identifier(schema), role=sql.Identifier(role)
                )
            )
