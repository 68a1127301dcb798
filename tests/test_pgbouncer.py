"""The PgBouncer harness (tests/pgbouncer.py) pools by transaction and is as strict as an
operator's: what `pytest --pgbouncer` finds is what a fleet behind PgBouncer would meet."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import DIRECT_URL
from tests.pgbouncer import PgBouncer, PgBouncerError, binary

pytestmark = pytest.mark.skipif(
    binary() is None, reason="pgbouncer is not installed (apt-get install pgbouncer; .ci/run)"
)


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    with PgBouncer(DIRECT_URL) as running:
        yield running


@pytest.mark.slow
def test_a_clients_statements_land_on_whichever_server_connection_is_free(
    bouncer: PgBouncer,
) -> None:
    with (
        psycopg.connect(bouncer.url, autocommit=True) as a,
        psycopg.connect(bouncer.url, autocommit=True) as b,
    ):
        first = b.execute("SELECT pg_backend_pid()").fetchone()
        with a.transaction():
            # Server connections are reused last-in first-out: A now holds the one B just used.
            held = a.execute("SELECT pg_backend_pid()").fetchone()
            second = b.execute("SELECT pg_backend_pid()").fetchone()
    assert first == held
    assert second != first  # same client connection, another server session


def test_it_refuses_startup_parameters_it_cannot_track(bouncer: PgBouncer) -> None:
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(bouncer.url, options="-c search_path=public").close()
    with (
        psycopg.connect(bouncer.url, autocommit=True),
        psycopg.connect(bouncer.admin_url, autocommit=True) as console,
    ):
        modes = {row[0]: row[-1] for row in console.execute("SHOW POOLS").fetchall()}
    assert modes[psycopg.conninfo.conninfo_to_dict(DIRECT_URL)["dbname"]] == "transaction"


def test_it_fronts_only_a_local_postgres() -> None:
    with pytest.raises(PgBouncerError, match="local Postgres only"):
        PgBouncer("postgresql://postgres@db.example.com:5432/test")
