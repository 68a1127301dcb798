"""The embedded default: with DATABASE_URL unset, a Postgres run by the ``pgserver`` package
under ``$CONNECTOR_SYNC_HOME/pgdata``, started on demand and left running for the next
command."""

from __future__ import annotations

import logging
from pathlib import Path

from sync.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


def embedded_url(home: Path) -> str:
    """Start (or reuse) the embedded Postgres and return its URL."""
    try:
        import pgserver
    except ImportError:  # pragma: no cover - it is a dependency
        raise DatabaseUnavailable(
            "DATABASE_URL is unset and the embedded Postgres (pgserver) is not installed; set "
            "DATABASE_URL or `pip install pgserver`"
        ) from None
    data = (home / "pgdata").resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(data, cleanup_mode=None)
    except Exception as exc:
        raise DatabaseUnavailable(
            f"the embedded Postgres under {data} did not start ({exc}); remove that directory "
            "to start afresh, or set DATABASE_URL"
        ) from None
    return str(server.get_uri())
