"""Declared providers through the Python API (a part of :class:`sync.api.Engine`): a provider
file checked (every mistake with its line), stored as its provider's next version (a new
version replaces the old for the runs that start after; running ones finish on theirs),
listed, and removed once no connection uses it. A declared provider may not take an installed
plugin's name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.declarative import ProviderSpec, json_schema, parse
from connectors.registry import declared, plugins
from sync.errors import Conflict, NotFound
from sync.jobs.declared import DeclaredProviders
from sync.store.db import Pool


@dataclass(frozen=True)
class DeclaredProvider:
    """A stored provider file: its name, the version new runs take, its tables."""

    name: str
    version: int
    tables: list[str]


def check_provider_file(text: str) -> ProviderSpec:
    """The provider ``text`` declares, or ``ProviderFileError`` naming each mistake's line
    (also a name an installed plugin has). Nothing is stored."""
    return parse(text, reserved=plugins())


def provider_schema() -> dict[str, Any]:
    """The JSON Schema of a provider file, for editors."""
    return json_schema()


class ProvidersApi:
    """The declared providers' part of the API; ``pool`` is the engine's."""

    pool: Pool

    @property
    def _declared(self) -> DeclaredProviders:
        loader: DeclaredProviders | None = getattr(self, "_declared_loader", None)
        if loader is None:
            loader = DeclaredProviders(self.pool)
            self._declared_loader = loader
        return loader

    def load_providers(self) -> list[str]:
        """Load the declared providers of the database into this process (beside the
        installed plugins), so connections of them can be created and listed; their names."""
        return self._declared.refresh()

    def add_provider(self, text: str) -> DeclaredProvider:
        """Check a provider file and store it as the next version of its provider; the runs
        that start after take it."""
        spec = check_provider_file(text)
        version = self._declared.store.add(spec.provider, text)
        self._declared.refresh()
        return DeclaredProvider(spec.provider, version, [t.name for t in spec.tables])

    def declared_providers(self) -> list[DeclaredProvider]:
        """The declared providers, with the version new runs take."""
        self._declared.refresh()
        return [
            DeclaredProvider(name, getattr(cls, "version", 0) or 0, [t.name for t in cls.tables])
            for name, cls in declared().items()
        ]

    def remove_provider(self, name: str) -> None:
        """Remove a declared provider; refused while a connection uses it."""
        if name not in self._declared.store.heads():
            raise NotFound(f"no declared provider {name!r} (`connector-sync providers` lists them)")
        using = self._declared.store.remove(name)
        if using:
            raise Conflict(
                f"{using} connection(s) use provider {name!r}; delete them first "
                f"(connector-sync connections list)"
            )
        self._declared.refresh()
