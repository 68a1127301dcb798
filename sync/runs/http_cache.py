"""The engine's side of conditional requests: the last response with an ETag per connection
and URL, in ``http_cache``. Keys are the URL's SHA-256 (a key in a query string is never
stored); bodies are zlib-compressed. A connection's entries go with it when it is purged."""

from __future__ import annotations

import hashlib
import zlib

from connectors.context import CachedResponse
from sync.store import Lease, RunStore


class HttpCache:
    def __init__(self, store: RunStore, lease: Lease, connection_id: int) -> None:
        self._store = store
        self._lease = lease
        self._connection_id = connection_id

    def get(self, url: str) -> CachedResponse | None:
        found = self._store.cached_response(self._connection_id, _key(url))
        if found is None:
            return None
        etag, headers, body = found
        return CachedResponse(etag, headers, zlib.decompress(body))

    def put(self, url: str, response: CachedResponse) -> None:
        """Fenced: a worker that lost its lease stores nothing (and is stopping anyway)."""
        self._store.store_response(
            self._lease,
            self._connection_id,
            _key(url),
            response.etag,
            dict(response.headers),
            zlib.compress(response.body, 1),
        )


def _key(url: str) -> bytes:
    return hashlib.sha256(url.encode()).digest()
