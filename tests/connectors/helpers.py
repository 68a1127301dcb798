"""Shared by the reference connectors' tests: recorded-style fixtures, provider-shaped responses,
and what the engine stored."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import httpx

from sync import Engine
from sync.models import Run

FIXTURES = Path(__file__).parent / "fixtures"


@cache
def _load(provider: str, name: str) -> Any:
    return json.loads((FIXTURES / provider / name).read_text())


def fixture(provider: str, name: str) -> Any:
    """A fresh copy of a fixture body, so a test may change it."""
    return copy.deepcopy(_load(provider, name))


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> httpx.Response:
    """A JSON response as providers send it: UTF-8 bytes with a charset in the content type."""
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})},
    )


def result(
    status: str = "succeeded",
    upserted: int = 0,
    unchanged: int = 0,
    tombstoned: int = 0,
    error: Any = None,
) -> dict[str, Any]:
    return {
        "status": status,
        "upserted": upserted,
        "unchanged": unchanged,
        "tombstoned": tombstoned,
        "error": error,
    }


def plain(results: dict[str, Any]) -> dict[str, Any]:
    """Per-table results without the per-partition detail and the provider's totals."""
    keys = ("status", "upserted", "unchanged", "tombstoned", "error")
    return {table: {k: r[k] for k in keys} for table, r in results.items()}


def stored_credentials(engine: Engine, connection_id: int) -> dict[str, Any]:
    """The connection's credentials as saved (decrypted)."""
    with engine.pool.connection() as conn:
        row = conn.execute(
            "SELECT credentials FROM connections WHERE id = %s", (connection_id,)
        ).fetchone()
    assert row is not None and row["credentials"] is not None
    return engine.secrets.decrypt(row["credentials"])


def live_ids(engine: Engine, connection_id: int, table: str) -> set[str]:
    return {r.external_id for r in engine.records(connection_id, table)}


def tombstoned_ids(engine: Engine, connection_id: int, table: str) -> set[str]:
    return {
        r.external_id
        for r in engine.records(connection_id, table, include_deleted=True)
        if r.deleted_at is not None
    }


def requeued_in(run: Run, *, after: datetime) -> float:
    """Seconds from ``after`` to the time the requeued run is due."""
    assert run.status == "queued", (run.status, run.error)
    return (run.queued_at - after).total_seconds()


def now() -> datetime:
    return datetime.now(UTC)
