"""The connector class, its tables and what reading a table yields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from connectors.context import ConnectorContext


class Mode(StrEnum):
    """How a table is synced."""

    FULL = "full"
    """Every sync reads everything; rows not seen in a complete read are tombstoned."""
    INCREMENTAL = "incremental"
    """A cursor is saved per table; the connector reports deletions with :class:`Deleted`."""


@dataclass(frozen=True)
class Table:
    """A table a connector syncs: its name, the record field(s) that identify a row, its mode."""

    name: str
    primary_key: str | tuple[str, ...] = "id"
    mode: Mode = Mode.FULL


@dataclass(frozen=True)
class Deleted:
    """Yielded by an incremental table: the row with this primary key was deleted upstream."""

    external_id: str


@dataclass(frozen=True)
class Checkpoint:
    """Yielded by an incremental table after the records it covers: once they are written the
    engine saves ``cursor``, and the next sync resumes from it."""

    cursor: Any


Item = Mapping[str, Any] | Deleted | Checkpoint
"""One thing a table read yields. A page (a list of items) may be yielded instead."""


class NoConfig(BaseModel):
    """The config model of a connector that takes no settings."""

    model_config = ConfigDict(extra="forbid")


class Connector:
    """Subclass this, set ``provider``, ``tables`` and ``config_model``, implement ``read``, and
    register the class with :func:`connectors.register` or an entry point."""

    provider: ClassVar[str]
    tables: ClassVar[Sequence[Table]] = ()
    config_model: ClassVar[type[BaseModel]] = NoConfig

    def __init__(self, context: ConnectorContext) -> None:
        self.context = context

    def read(self, table: Table) -> Iterable[Item | Sequence[Item]]:
        """Yield the records of ``table`` (dicts), page by page if you like."""
        raise NotImplementedError(f"{type(self).__name__} does not implement read()")

    def close(self) -> None:
        """Release what the connector holds (HTTP clients). Called once after the run."""
