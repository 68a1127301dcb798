"""Declared providers for tests: a file's text made into its connector and a FakeContext."""

from __future__ import annotations

import textwrap
from typing import Any

from connectors.base import Checkpoint, Deleted, Position, Resync
from connectors.declarative import DeclarativeConnector, build, parse
from connectors.testing import FakeContext, read_table

API = "https://api.tiny.example"


def declared(text: str) -> type[DeclarativeConnector]:
    return build(parse(textwrap.dedent(text)))


def open_connector(
    text: str,
    config: dict[str, Any] | None = None,
    credentials: dict[str, Any] | None = None,
    **context: Any,
) -> tuple[DeclarativeConnector, FakeContext]:
    cls = declared(text)
    fake = FakeContext.of(
        cls, config={"base_url": API, **(config or {})}, credentials=credentials or {}, **context
    )
    return cls(fake), fake


def rows(items: list[Any]) -> list[Any]:
    """The records of what a table yielded, without its positions and checkpoints."""
    return [i for i in items if isinstance(i, dict)]


def positions(items: list[Any]) -> list[Any]:
    return [i.value for i in items if isinstance(i, Position)]


def checkpoints(items: list[Any]) -> list[Any]:
    return [i.cursor for i in items if isinstance(i, Checkpoint)]


def deleted(items: list[Any]) -> list[str]:
    return [i.external_id for i in items if isinstance(i, Deleted)]


def resyncs(items: list[Any]) -> int:
    return sum(isinstance(i, Resync) for i in items)


__all__ = ["API", "read_table"]
