"""Declared providers in a process: the files stored in the database (``providers add``) made
into connector classes and put in this process's registry beside the installed plugins, so the
API validates connections of them and a worker claims and runs their syncs without a deploy.
A run reads with the version its first attempt took, whatever was added since."""

from __future__ import annotations

import logging
import threading

import connectors
from connectors.base import Connector
from connectors.declarative import (
    DeclarativeConnector,
    ProviderFileError,
    connector_from_source,
)
from connectors.errors import PermanentError
from connectors.registry import declare, declared, undeclare
from sync.store.db import Pool
from sync.store.providers import ProviderStore
from sync.store.rows import Lease

log = logging.getLogger("sync.providers")


class DeclaredProviders:
    """Keeps this process's registry of declared providers in step with the database."""

    def __init__(self, pool: Pool) -> None:
        self.store = ProviderStore(pool)
        self._lock = threading.Lock()
        # Versions that could not be loaded (a file this build refuses, a name a plugin has
        # here), said once each.
        self._refused: set[tuple[str, int]] = set()

    def refresh(self) -> list[str]:
        """Load the versions added since the last refresh and forget removed providers; the
        names declared now in this process."""
        heads = self.store.heads()
        with self._lock:
            loaded = {name: _version(cls) for name, cls in declared().items()}
            for name in set(loaded) - set(heads):
                undeclare(name)
                log.info("declared provider %s was removed", name)
            wanted = {
                name: version
                for name, version in heads.items()
                if loaded.get(name) != version and (name, version) not in self._refused
            }
            if wanted:
                for found in self.store.sources(wanted):
                    self._load(found.name, found.version, found.source)
            return sorted(declared())

    def _load(self, name: str, version: int, source: str) -> None:
        try:
            declare(connector_from_source(source, version))
        except (ProviderFileError, connectors.DuplicateProvider) as exc:
            self._refused.add((name, version))
            log.warning("declared provider %s (version %d) is not loaded: %s", name, version, exc)
            return
        log.info("declared provider %s loaded (version %d)", name, version)

    def pinned(self, lease: Lease, provider: str) -> type[Connector]:
        """The connector a run of a declared provider reads with: the version its first
        attempt took (kept for its later attempts), else the current one."""
        found = self.store.pin(lease, provider)
        if found is None:
            raise PermanentError(
                f"provider {provider!r} is neither installed nor declared (or the run's lease "
                "is lost)"
            )
        try:
            return connector_from_source(found.source, found.version)
        except ProviderFileError as exc:
            raise PermanentError(f"declared provider {provider!r}: {exc}") from None


def _version(cls: type[Connector]) -> int | None:
    return cls.version if issubclass(cls, DeclarativeConnector) else None
