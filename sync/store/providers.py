"""The statements of declared providers (``sql/providers.sql``), as typed methods: a file stored
as its provider's next version, the versions processes load, a removal that refuses while
connections use the provider, and the version a run reads with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sync.store.db import Connection
from sync.store.pooled import PooledStore
from sync.store.queries import NamedQueries
from sync.store.rows import Lease

QUERIES = NamedQueries("providers.sql")


@dataclass(frozen=True)
class DeclaredVersion:
    name: str
    version: int
    source: str
    created_at: datetime | None = None


class ProviderStore(PooledStore):
    def add(self, name: str, source: str) -> int:
        """Store ``source`` as ``name``'s next version, the one new runs take; its number."""

        def call(conn: Connection) -> int:
            conn.execute(QUERIES.claim_declared_name, {"name": name})
            row = conn.execute(
                QUERIES.add_declared_version, {"name": name, "source": source}
            ).fetchone()
            assert row is not None
            conn.execute(QUERIES.point_declared_provider, {"name": name, "version": row["version"]})
            return int(row["version"])

        return self._in_transaction(call)

    def heads(self) -> dict[str, int]:
        """Each declared provider and the version new runs take."""
        rows = self._on_pool(lambda c: c.execute(QUERIES.declared_heads).fetchall())
        return {r["name"]: r["version"] for r in rows}

    def sources(self, wanted: dict[str, int]) -> list[DeclaredVersion]:
        """The files of the given versions (those still stored)."""
        params = {"names": list(wanted), "versions": list(wanted.values())}
        rows = self._on_pool(lambda c: c.execute(QUERIES.declared_sources, params).fetchall())
        return [
            DeclaredVersion(r["name"], r["version"], r["source"], r["created_at"]) for r in rows
        ]

    def remove(self, name: str) -> int | None:
        """Remove a declared provider: the number of connections that use it, which refuse
        the removal (nothing is removed), or None once removed (also when it was not there)."""

        def call(conn: Connection) -> int | None:
            conn.execute(QUERIES.lock_declared_provider, {"name": name})
            row = conn.execute(QUERIES.connections_of_provider, {"provider": name}).fetchone()
            count = int(row["connections"]) if row else 0
            if count:
                return count
            conn.execute(QUERIES.remove_declared_provider, {"name": name})
            return None

        return self._in_transaction(call)

    def pin(self, lease: Lease, provider: str) -> DeclaredVersion | None:
        """The version the run reads with: its first attempt's, else the current one, kept
        for its later attempts. None: the lease is lost, or the provider is not declared."""
        params = {"run_id": lease.id, "lease_owner": lease.owner, "provider": provider}
        row = self._on_pool(
            lambda c: c.execute(QUERIES.pin_declared_version, params).fetchone(), idempotent=True
        )
        return None if row is None else DeclaredVersion(provider, row["version"], row["source"])
