"""Sends on the caller's own psycopg connection, sync or async, inside its open transaction:
the job commits with the caller's rows or rolls back with them, and its wake-up notification
goes out at commit. Nothing is left behind on the connection: the statements name the schema
(the caller's search_path is the application's), take their rows as dicts through a cursor of
their own, and are never prepared on the server, so they work behind a transaction pooler."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sync.queues.sending import Outgoing, SendResult, send_params
from sync.queues.store import caller_statement


def _statement(sent: Outgoing) -> str:
    return "send_job" if len(sent.payloads) == 1 else "send_jobs"


def send_on(
    conn: psycopg.Connection[Any], schema: str, sent: Outgoing, now: datetime | None
) -> list[SendResult]:
    """Queue ``sent`` on ``conn``, in its open transaction (or at once in autocommit)."""
    query = caller_statement(_statement(sent), schema)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, send_params(sent, now), prepare=False)
        return [SendResult(r["job_id"], r["outcome"]) for r in cur.fetchall()]


async def send_on_async(
    conn: psycopg.AsyncConnection[Any], schema: str, sent: Outgoing, now: datetime | None
) -> list[SendResult]:
    """:func:`send_on` for an async connection."""
    query = caller_statement(_statement(sent), schema)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, send_params(sent, now), prepare=False)
        return [SendResult(r["job_id"], r["outcome"]) for r in await cur.fetchall()]
