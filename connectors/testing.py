"""Test a connector offline, without Postgres: a :class:`FakeContext` stands in for the engine,
and :func:`read_table` collects what a table yields. For a full sync through the engine against
a real database, see ``sync.testing``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from connectors.base import Connector, Item, Table
from connectors.context import CachedResponse
from connectors.errors import Aborted


@dataclass
class FakeContext:
    """An in-memory ConnectorContext. Sleeps are recorded, not slept.

    ``config`` is the connector's config model, as the engine gives it: ``FakeContext(
    config=MyConfig(...))``, or :meth:`of` with a dict, validated as the engine validates a
    connection's."""

    config: BaseModel
    credentials: Mapping[str, Any] = field(default_factory=dict)
    cursors: dict[str, Any] = field(default_factory=dict)
    positions: dict[tuple[str, str | None], Any] = field(default_factory=dict)
    cache: dict[str, CachedResponse] = field(default_factory=dict)
    max_inline_wait: float = 30.0
    aborted: bool = False
    slept: list[float] = field(default_factory=list)
    rate_limit_waits: list[float] = field(default_factory=list)  # slept inside the run
    refreshes: int = 0
    rate_limits: list[tuple[datetime, str]] = field(default_factory=list)
    blocked_until: datetime | None = None
    logger: logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.LoggerAdapter(logging.getLogger("connector.test"), {})
    )

    def __post_init__(self) -> None:
        if not isinstance(self.config, BaseModel):
            raise TypeError(
                "FakeContext(config=...) takes the connector's config model, not a "
                f"{type(self.config).__name__}: FakeContext(config=MyConfig(...)), or "
                "FakeContext.of(MyConnector, config={...}) to validate a dict as the engine does"
            )

    @classmethod
    def of(
        cls,
        connector: type[Connector],
        config: Mapping[str, Any] | BaseModel | None = None,
        credentials: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> FakeContext:
        """A context for ``connector``: ``config`` validated by its ``config_model`` and the
        ``credentials`` by its ``credentials_model`` (when it has one), as the engine validates a
        connection's, so a mistake is a ``ValidationError`` naming the field here rather than an
        error inside the connector. ``fields``: the context's other fields (``cursors``...)."""
        model = connector.config_model
        validated = config if isinstance(config, model) else model.model_validate(config or {})
        if connector.credentials_model is not None:
            connector.credentials_model.model_validate(dict(credentials or {}))
        return cls(config=validated, credentials=dict(credentials or {}), **fields)

    def cursor(self, table: str, partition: str | None = None) -> Any | None:
        saved = self.cursors.get(table)
        if partition is None:
            return saved
        return saved.get(partition) if isinstance(saved, dict) else None

    def position(self, table: str, partition: str | None = None) -> Any | None:
        return self.positions.get((table, partition))

    def cached_response(self, url: str) -> CachedResponse | None:
        return self.cache.get(url)

    def store_response(self, url: str, response: CachedResponse) -> None:
        self.cache[url] = response

    def check_abort(self) -> None:
        if self.aborted:
            raise Aborted("test")

    def sleep(self, seconds: float) -> None:
        self.check_abort()
        self.slept.append(seconds)

    def rate_limit_slept(self, seconds: float) -> None:
        self.rate_limit_waits.append(seconds)

    def refresh_credentials(
        self, refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> Mapping[str, Any]:
        self.refreshes += 1
        self.credentials = dict(refresh(self.credentials))
        return self.credentials

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        self.rate_limits.append((until, reason))

    def rate_limited_until(self) -> datetime | None:
        return self.blocked_until


def read_table(connector: Connector, table: Table | str) -> list[Item]:
    """Everything ``table`` yields, pages flattened; a partitioned table's partitions one after
    the other."""
    if isinstance(table, str):
        table = next(t for t in connector.tables if t.name == table)
    partitions = connector.partitions(table)
    if partitions is None:
        return _collect(connector.read(table))
    items: list[Item] = []
    for partition in partitions:
        items.extend(_collect(connector.read_partition(table, partition)))
    return items


def _collect(read: Iterable[Any]) -> list[Item]:
    items: list[Item] = []
    for item in read:
        if isinstance(item, Mapping) or not isinstance(item, Iterable):
            items.append(item)
        else:
            items.extend(_flatten(item))
    return items


def _flatten(page: Iterable[Any] | Sequence[Any]) -> list[Item]:
    return list(page)
