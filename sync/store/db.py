"""Connections to Postgres: a pool for the engine's statements, dedicated connections for
LISTEN and the lease keeper, all with ``search_path`` set to the configured schema so the named
queries need no schema prefix.

Connected directly, the engine's settings (``search_path``, the timeouts) are session settings,
sent once as the ``options`` startup parameter. Behind a transaction pooler
(``CONNECTOR_SYNC_POOLER=transaction``) there is no session to keep them: the connections are
:class:`~sync.store.transaction_pooler.PoolerConnection`, which send them in every transaction, and
prepare no statement on the server (a prepared statement lives on one server connection, and
the pooler hands out another).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader
from psycopg_pool import ConnectionPool

from sync.base import redact
from sync.base.database_url import check, describe, scrub, secrets_in
from sync.base.settings import Settings
from sync.errors import DatabaseUnavailable
from sync.store.transaction_pooler import PoolerConnection, PoolerCursor, bind

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


def session_settings(settings: Settings) -> dict[str, str]:
    """What every statement of the engine runs with, by Postgres setting name."""
    # A stuck statement or lock fails after a bound instead of freezing a worker.
    idle_in_transaction = int(settings.idle_in_transaction_timeout * 1000)
    return {
        "statement_timeout": f"{int(settings.statement_timeout * 1000)}ms",
        "lock_timeout": f"{int(settings.lock_timeout * 1000)}ms",
        "idle_in_transaction_session_timeout": f"{idle_in_transaction}ms",
        # Short statements: JIT compilation would cost more than it ever saves.
        "jit": "off",
        "search_path": settings.schema_name,
    }


def behind_pooler(settings: Settings) -> bool:
    """True when a transaction pooler stands between the engine and Postgres."""
    return settings.pooler == "transaction"


def connection_kwargs(settings: Settings, purpose: str = "") -> dict[str, Any]:
    # Operators find our sessions in pg_stat_activity by this name.
    app = f"connector-sync/{settings.schema_name}" + (f"/{purpose}" if purpose else "")
    common = {"application_name": app, "connect_timeout": settings.connect_timeout, **KEEPALIVES}
    if behind_pooler(settings):
        # No startup options (PgBouncer refuses them) and no server-side prepared statements.
        return {"prepare_threshold": None, "cursor_factory": PoolerCursor, **common}
    options = " ".join(f"-c {k}={v}" for k, v in session_settings(settings).items())
    return {"options": options, **common}


def connection_class(settings: Settings) -> type[Connection]:
    return PoolerConnection if behind_pooler(settings) else Connection


_decode = json.JSONDecoder().decode


def _loads(data: str | bytes) -> Any:
    """json.loads() of bytes, without its guess of their encoding: Postgres sends UTF-8. A
    claim of a hundred jobs parses a hundred payloads."""
    return _decode(data if isinstance(data, str) else data.decode())


class _Jsonb(JsonbLoader):
    _loads = staticmethod(_loads)


class _JsonbBinary(JsonbBinaryLoader):
    _loads = staticmethod(_loads)


def _configure(settings: Settings) -> Callable[[Connection], None]:
    values = session_settings(settings)

    def configure(conn: Connection) -> None:
        conn.adapters.register_loader("jsonb", _Jsonb)
        conn.adapters.register_loader("jsonb", _JsonbBinary)
        bind(conn, values)

    return configure


def connect(settings: Settings, url: str, *, purpose: str = "") -> Connection:
    """One autocommit connection outside the pool (the lease keeper's, a reachability check)."""
    _check(url)
    try:
        conn = connection_class(settings).connect(
            url, autocommit=True, row_factory=dict_row, **connection_kwargs(settings, purpose)
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
    _configure(settings)(conn)
    return conn


def listen_url(settings: Settings, url: str) -> str | None:
    """Where the worker's LISTEN connection goes: ``listen_url`` if set, else ``url``; None
    behind a transaction pooler without one (LISTEN needs a session: the worker polls)."""
    if settings.listen_url:
        return settings.listen_url
    return None if behind_pooler(settings) else url


def connect_listener(settings: Settings, url: str) -> Connection:
    """The LISTEN connection: a session of its own on ``url`` (Postgres itself, or a pooler in
    session mode), with no startup options, since it runs only schema-qualified statements."""
    _check(url)
    try:
        params: dict[str, Any] = {
            "application_name": f"connector-sync/{settings.schema_name}/listen",
            "connect_timeout": settings.connect_timeout,
            **KEEPALIVES,
        }
        return psycopg.connect(url, autocommit=True, row_factory=dict_row, **params)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {describe(url)} to LISTEN: {scrub(first_line(exc), url)}; "
            "check CONNECTOR_SYNC_LISTEN_URL (or DATABASE_URL) and that Postgres is running"
        ) from None
    except psycopg.ProgrammingError as exc:
        raise DatabaseUnavailable(
            f"the LISTEN URL is not a valid Postgres URL ({scrub(first_line(exc), url)})"
        ) from None


def open_pool(settings: Settings, url: str, *, size: int | None = None) -> Pool:
    """A pool of autocommit connections; transactions are explicit (``conn.transaction()``)."""
    _check(url)
    size = size or settings.pool_size
    pool: Pool = ConnectionPool(
        url,
        connection_class=connection_class(settings),
        min_size=1,
        max_size=size,
        kwargs={"autocommit": True, "row_factory": dict_row, **connection_kwargs(settings)},
        configure=_configure(settings),
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
