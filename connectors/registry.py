"""Connectors registered by provider name: by decorator, or by a package's entry point in the
``connector_sync.connectors`` group (the installed plugins), and the declared providers the
engine loaded from its database into this process (:func:`declare`). A declared provider never
shadows a plugin: the plugin's name wins."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import TypeVar

from connectors.base import Connector

ENTRY_POINT_GROUP = "connector_sync.connectors"

log = logging.getLogger(__name__)

C = TypeVar("C", bound=type[Connector])

_registered: dict[str, tuple[type[Connector], str]] = {}
_declared: dict[str, type[Connector]] = {}
_entry_points_loaded = False


class UnknownProvider(LookupError):
    def __init__(self, provider: str, known: list[str]) -> None:
        listing = ", ".join(known) or "none"
        super().__init__(
            f"no connector is registered for provider {provider!r} (known: {listing}); "
            "install the package that provides it, or declare it with `connector-sync "
            "providers add FILE`"
        )
        self.provider = provider


class DuplicateProvider(ValueError):
    pass


def register(cls: C) -> C:
    """Class decorator: register ``cls`` under ``cls.provider``."""
    _add(cls, f"{cls.__module__}.{cls.__qualname__}")
    return cls


def _add(cls: type[Connector], source: str) -> None:
    provider = getattr(cls, "provider", None)
    if not isinstance(provider, str) or not provider:
        raise TypeError(f"{source} must set a non-empty `provider` class attribute")
    _check_files(cls, source)
    existing = _registered.get(provider)
    if existing is not None and existing[0] is not cls:
        raise DuplicateProvider(
            f"provider {provider!r} is registered twice: by {existing[1]} and by {source}"
        )
    _registered[provider] = (cls, source)
    if _declared.pop(provider, None) is not None:
        log.warning(
            "provider %r is installed (%s): its declared version is set aside", provider, source
        )


def declare(cls: type[Connector]) -> None:
    """Make a declared provider known to this process, in place of its earlier version; a
    name an installed plugin holds raises :class:`DuplicateProvider`."""
    _load_entry_points()
    plugin = _registered.get(cls.provider)
    if plugin is not None:
        raise DuplicateProvider(
            f"provider {cls.provider!r} is an installed plugin ({plugin[1]}); a declared "
            "provider may not shadow it: give the file another `provider` name"
        )
    _declared[cls.provider] = cls


def undeclare(provider: str) -> None:
    """Forget a declared provider in this process (it was removed)."""
    _declared.pop(provider, None)


def declared() -> dict[str, type[Connector]]:
    """The declared providers this process has loaded, by name."""
    # A copy first: a worker's loader thread may declare while another thread reads.
    return dict(sorted(_declared.copy().items()))


def plugins() -> dict[str, type[Connector]]:
    """The installed plugins (and classes registered by decorator), by name."""
    _load_entry_points()
    return {name: cls for name, (cls, _) in sorted(_registered.copy().items())}


def _check_files(cls: type[Connector], source: str) -> None:
    """A connector whose tables hold files must say how to describe and fetch them: refused
    when it is registered, not when a file is first indexed."""
    tables = [t.name for t in cls.tables if t.files]
    if not tables:
        return
    missing = [
        name
        for name in ("describe_file", "download")
        if next(k for k in cls.__mro__ if name in vars(k)) is Connector
    ]
    if missing:
        raise TypeError(
            f"{source} declares files in table {tables[0]!r} but does not implement "
            f"{' and '.join(f'{m}()' for m in missing)}"
        )


def _load_entry_points() -> None:
    """Load the installed plugins once. A plugin that fails to import is skipped with a
    warning (the others still work); a duplicate provider name raises on every call until
    it is fixed."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:
            log.warning("connector plugin %r (%s) failed to load: %s", ep.name, ep.value, exc)
            continue
        _add(cls, f"entry point {ep.name!r} ({ep.value})")
    _entry_points_loaded = True


def get(provider: str) -> type[Connector]:
    """The connector class registered for ``provider``."""
    _load_entry_points()
    found = _registered.get(provider)
    if found is not None:
        return found[0]
    try:
        return _declared[provider]
    except KeyError:
        raise UnknownProvider(provider, sorted({*_registered, *_declared})) from None


def providers() -> dict[str, type[Connector]]:
    """Every provider name and its class: the plugins and the declared providers loaded."""
    return dict(sorted({**declared(), **plugins()}.items()))


def unregister(provider: str) -> None:
    """Remove a provider (tests use this to clean up after themselves)."""
    _registered.pop(provider, None)
    _declared.pop(provider, None)
