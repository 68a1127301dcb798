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


@dataclass(frozen=True)
class Resync:
    """Yielded by an incremental table whose provider asked for a full resync (Microsoft Graph's
    410 on a delta link): the rows that follow are the whole table, so rows not among them are
    tombstoned when the table completes, as for a ``full`` table."""


Item = Mapping[str, Any] | Deleted | Checkpoint | Resync
"""One thing a table read yields. A page (a list of items) may be yielded instead."""


class NoConfig(BaseModel):
    """The config model of a connector that takes no settings."""

    model_config = ConfigDict(extra="forbid")


class Connector:
    """Subclass this, set ``provider``, ``tables`` and ``config_model`` (and, if you like,
    ``credentials_model``), implement ``read``, and register the class with
    :func:`connectors.register` or an entry point."""

    provider: ClassVar[str]
    tables: ClassVar[Sequence[Table]] = ()
    config_model: ClassVar[type[BaseModel]] = NoConfig
    credentials_model: ClassVar[type[BaseModel] | None] = None
    """Optional: a pydantic model of the credentials (see ``connectors.credentials``). The
    engine refuses credentials that do not validate when a connection is created or given new
    ones; None accepts any."""

    def __init__(self, context: ConnectorContext) -> None:
        self.context = context

    @classmethod
    def budget_key(cls, config: BaseModel, credentials: Mapping[str, Any]) -> str | None:
        """The rate budget this connection draws on (the token, the OAuth app, the tenant), or
        None if it shares none. Connections with one key are throttled together across workers.
        The engine stores only a hash of the key."""
        return None

    def read(self, table: Table) -> Iterable[Item | Sequence[Item]]:
        """Yield the records of ``table`` (dicts), page by page if you like."""
        raise NotImplementedError(f"{type(self).__name__} does not implement read()")

    def close(self) -> None:
        """Release what the connector holds (HTTP clients). Called once after the run."""
