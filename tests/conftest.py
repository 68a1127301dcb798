"""Every test gets its own schema in the test database (DATABASE_URL, else the local test
database), migrated fresh and dropped afterwards, so tests run in parallel and leave nothing.

Tests that start a process (a worker, the ``connector-sync`` script, an embedded Postgres, a
browser, the linters) or stress many at once are marked ``slow``; ``pytest -m "not slow"`` is
the quick tier, and a test outside it that starts a process fails, saying to mark it.

``pytest --pgbouncer`` runs the suite through a private PgBouncer in transaction pooling mode
(tests/pgbouncer.py), configured the way docs/operations.md tells an operator to run a fleet
behind one: DATABASE_URL, for the tests and every process they start, points at PgBouncer,
``CONNECTOR_SYNC_POOLER=transaction``, and ``CONNECTOR_SYNC_LISTEN_URL`` is Postgres itself
(DIRECT_URL), for the workers' LISTEN. Schemas are migrated through PgBouncer too; only the
fixtures that drop a test's schema and the ``admin`` connection tests inspect state with reach
Postgres directly. A test about a direct connection (cutting backends) is skipped there with its
reason (``direct_only``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.fernet import Fernet
from hypothesis import settings as hypothesis_settings

import tests.fakes  # noqa: F401 - registers the test connectors
from sync import Engine, Settings

pytest_plugins = ["sync.testing", "tests.cli_backends"]

# Property tests check what holds, never how fast: no example fails for the wall-clock time it
# took on a loaded machine.
hypothesis_settings.register_profile("suite")
hypothesis_settings.load_profile("suite")

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
# Postgres itself; set apart from DATABASE_URL only by `--pgbouncer` (inherited by xdist workers).
DIRECT_URL = os.environ.get("CONNECTOR_SYNC_TEST_DIRECT_URL", DATABASE_URL)
PGBOUNCER_LOG = Path(__file__).resolve().parent.parent / "test-artifacts" / "pgbouncer.log"
# One key for the session, inherited by worker subprocesses through the environment.
os.environ.setdefault("CONNECTOR_SYNC_SECRET_KEYS", Fernet.generate_key().decode())


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("connector-sync")
    group.addoption(
        "--pgbouncer",
        action="store_true",
        help="run the tests through a private PgBouncer in transaction pooling mode "
        "(Debian's pgbouncer); its log is left in test-artifacts/pgbouncer.log",
    )


def pytest_configure(config: pytest.Config) -> None:
    global DATABASE_URL, DIRECT_URL
    # xdist workers inherit the environment the controller sets up here.
    if not config.getoption("pgbouncer") or hasattr(config, "workerinput"):
        return
    from tests.pgbouncer import PgBouncer

    bouncer = PgBouncer(DATABASE_URL).start()
    config.add_cleanup(lambda: bouncer.stop(keep_log=PGBOUNCER_LOG))
    DIRECT_URL, DATABASE_URL = DATABASE_URL, bouncer.url
    os.environ["CONNECTOR_SYNC_TEST_DIRECT_URL"] = DIRECT_URL
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ["CONNECTOR_SYNC_POOLER"] = "transaction"
    os.environ["CONNECTOR_SYNC_LISTEN_URL"] = DIRECT_URL


def behind_pgbouncer() -> bool:
    """True under ``--pgbouncer`` (in the controller and in every xdist worker)."""
    return "CONNECTOR_SYNC_TEST_DIRECT_URL" in os.environ and DIRECT_URL != DATABASE_URL


def direct_only(reason: str) -> pytest.MarkDecorator:
    """Skips a test under ``--pgbouncer``: it is about a direct connection to Postgres."""
    return pytest.mark.skipif(behind_pgbouncer(), reason=f"behind PgBouncer: {reason}")


def make_settings(schema: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": DATABASE_URL,
        "schema_name": schema,
        # Each test's connections' typed views go to schemas of its own, dropped with it.
        "reader_schema_prefix": f"{schema}_",
        "backoff_seconds": (5.0, 30.0, 120.0),
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keeps ``pytest -m "not slow"`` quick: a test not marked slow may not start a process."""
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({args!r}); mark it "
            "@pytest.mark.slow, so that `pytest -m 'not slow'` stays the quick tier"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def drop_schemas_starting(prefix: str) -> None:
    """Drop the schemas whose name starts with ``prefix`` (connections' typed views)."""
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        found = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
        ).fetchall()
        for (name,) in found:
            conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(name)
                )
            )


@pytest.fixture(autouse=True)
def _reader_schemas_apart(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The schemas of connections' typed views live beside the test's schema, not in it: each
    test's (and its processes') get a prefix of its own, and are dropped after it, so tests
    running at once or one after another never meet each other's."""
    prefix = f"r{uuid.uuid4().hex[:8]}_"
    monkeypatch.setenv("CONNECTOR_SYNC_READER_SCHEMA_PREFIX", prefix)
    yield
    with contextlib.suppress(psycopg.OperationalError):  # a test without a database
        drop_schemas_starting(prefix)


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    # The connections' schemas first, each on its own: dropped in the cascade of the test's
    # schema, thousands of typed views would need more locks than one transaction may hold.
    drop_schemas_starting(f"{name}_")
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def settings(schema: str) -> Settings:
    return make_settings(schema)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    with Engine(settings, pool_size=10) as eng:
        eng.migrate()
        yield eng


@pytest.fixture
def admin(schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection with search_path on the test schema, for inspecting state."""
    with psycopg.connect(
        DIRECT_URL,
        autocommit=True,
        options=f"-c search_path={schema}",
        row_factory=psycopg.rows.dict_row,
    ) as conn:
        yield conn
