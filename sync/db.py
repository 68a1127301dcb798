"""Connections to Postgres: a pool for the engine's statements, dedicated connections for
LISTEN, all with ``search_path`` set to the configured schema so the named queries need no
schema prefix."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from sync import redact
from sync.database_url import check, describe, scrub, secrets_in
from sync.errors import DatabaseUnavailable
from sync.settings import Settings

log = logging.getLogger(__name__)

Connection = psycopg.Connection[DictRow]
Pool = ConnectionPool[Connection]

# Worker sessions never wait forever: a stuck statement or lock fails, and sync.store.retry
# decides whether it is repeated.

# Half-open TCP connections are noticed within about a minute.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def connection_kwargs(settings: Settings, purpose: str = "") -> dict[str, Any]:
    # A stuck statement or lock fails after a bound instead of freezing a worker.
    idle_in_transaction = int(settings.idle_in_transaction_timeout * 1000)
    session = {
        "statement_timeout": f"{int(settings.statement_timeout * 1000)}ms",
        "lock_timeout": f"{int(settings.lock_timeout * 1000)}ms",
        "idle_in_transaction_session_timeout": f"{idle_in_transaction}ms",
        # Short statements: JIT compilation would cost more than it ever saves.
        "jit": "off",
        "search_path": settings.schema_name,
    }
    options = " ".join(f"-c {k}={v}" for k, v in session.items())
    # Operators find our sessions in pg_stat_activity by this name.
    app = f"connector-sync/{settings.schema_name}" + (f"/{purpose}" if purpose else "")
    return {"options": options, "application_name": app, **KEEPALIVES}


def connect(settings: Settings, url: str, *, purpose: str = "") -> Connection:
    """One autocommit connection outside the pool (the LISTEN connection)."""
    _check(url)
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=settings.connect_timeout,
            **connection_kwargs(settings, purpose),
        )
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {describe(url)}: {scrub(first_line(exc), url)}; check "
            "DATABASE_URL and that Postgres is running"
        ) from None
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(
            f"DATABASE_URL is not a valid Postgres URL ({scrub(first_line(exc), url)})"
        ) from None


def open_pool(settings: Settings, url: str, *, size: int | None = None) -> Pool:
    """A pool of autocommit connections; transactions are explicit (``conn.transaction()``)."""
    _check(url)
    size = size or settings.pool_size
    pool: Pool = ConnectionPool(
        url,
        connection_class=Connection,
        min_size=1,
        max_size=size,
        kwargs={
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": settings.connect_timeout,
            **connection_kwargs(settings),
        },
        check=_check_if_idle,
        open=False,
        name="connector-sync",
    )
    try:
        pool.open(wait=True, timeout=15)
    except Exception as exc:
        pool.close()
        # Surface the real reason, not the pool's timeout.
        connect(settings, url).close()
        raise DatabaseUnavailable(
            f"cannot open a pool to {describe(url)}: {scrub(str(exc), url)}"
        ) from None
    return pool


def _check(url: str) -> None:
    """Refuse a malformed URL in words of our own, and keep its password out of every log."""
    redact.register(secrets_in(url))
    check(url)


# A pooled connection not handed out for longer than this is checked (one empty round trip)
# first, so the first statement after a database restart or a network cut does not fail on a
# dead connection. A worker draining a queue reuses connections faster and pays nothing. (The
# time is taken at checkout: a `reset` callback would move every return onto a pool thread.)
CHECK_AFTER_IDLE = 1.0


def _check_if_idle(conn: Connection) -> None:
    now = time.monotonic()
    last = getattr(conn, "_cs_checked_out_at", None)
    conn._cs_checked_out_at = now  # type: ignore[attr-defined]
    if last is None or now - last > CHECK_AFTER_IDLE:
        ConnectionPool.check_connection(conn)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
