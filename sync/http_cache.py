"""The engine's side of conditional requests: the last response with an ETag per connection
and URL, in ``http_cache``. Keys are the URL's SHA-256 (a key in a query string is never
stored); bodies are zlib-compressed. A connection's entries go with it when it is purged."""

from __future__ import annotations

import hashlib
import zlib

from psycopg.types.json import Jsonb

from connectors.context import CachedResponse
from sync.db import Pool
from sync.lease import Lease
from sync.queries import QUERIES


class HttpCache:
    def __init__(self, pool: Pool, lease: Lease, connection_id: int) -> None:
        self._pool = pool
        self._lease = lease
        self._connection_id = connection_id

    def get(self, url: str) -> CachedResponse | None:
        with self._pool.connection() as conn:
            row = conn.execute(
                QUERIES.cached_response,
                {"connection_id": self._connection_id, "url_hash": _key(url)},
            ).fetchone()
        if row is None:
            return None
        return CachedResponse(row["etag"], dict(row["headers"]), zlib.decompress(row["body"]))

    def put(self, url: str, response: CachedResponse) -> None:
        """Fenced: a worker that lost its lease stores nothing (and is stopping anyway)."""
        with self._pool.connection() as conn:
            conn.execute(
                QUERIES.store_response,
                {
                    "run_id": self._lease.id,
                    "lease_owner": self._lease.owner,
                    "connection_id": self._connection_id,
                    "url_hash": _key(url),
                    "etag": response.etag,
                    "headers": Jsonb(dict(response.headers)),
                    "body": zlib.compress(response.body, 1),
                },
            )


def _key(url: str) -> bytes:
    return hashlib.sha256(url.encode()).digest()
