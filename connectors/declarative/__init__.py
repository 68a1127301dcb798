"""Declarative providers: a REST API described in one YAML file instead of a Python package.
:func:`parse` reads and checks a file (every mistake with its line), :func:`build` makes the
connector class it describes, an ordinary :class:`~connectors.Connector`; :func:`json_schema`
is the file format's JSON Schema. docs/declarative-connectors.md describes the format."""

from __future__ import annotations

from functools import lru_cache

from connectors.declarative.connector import DeclarativeConnector, build
from connectors.declarative.source import Mistake, ProviderFileError, parse
from connectors.declarative.spec import ProviderSpec, json_schema

__all__ = [
    "DeclarativeConnector",
    "Mistake",
    "ProviderFileError",
    "ProviderSpec",
    "build",
    "connector_from_source",
    "json_schema",
    "parse",
]


@lru_cache(maxsize=64)
def connector_from_source(source: str, version: int | None = None) -> type[DeclarativeConnector]:
    """The connector class of a provider file's text (made once per text and version)."""
    return build(parse(source), version=version)
