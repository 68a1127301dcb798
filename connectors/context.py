"""What a connector sees of the engine: a small protocol the engine implements."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

ConfigT_co = TypeVar("ConfigT_co", bound=BaseModel, covariant=True)


@dataclass(frozen=True)
class CachedResponse:
    """A response kept for conditional requests: its ETag, the headers worth keeping and the
    body."""

    etag: str
    headers: Mapping[str, str]
    body: bytes


class RequestContext(Protocol):
    """What an HTTP client needs of the job it sends requests for: a logger, the abort signal,
    sleeps that wake on it, the shared rate budget and the ETag cache. A connector's context is
    one; code outside any connector (an embeddings endpoint) may give a smaller one."""

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that already carries the run, connection and attempt."""
        ...

    def cached_response(self, url: str) -> CachedResponse | None:
        """The last response with an ETag this connection got from ``url``, if kept."""
        ...

    def store_response(self, url: str, response: CachedResponse) -> None:
        """Keep a response with an ETag for the next conditional request to ``url``."""
        ...

    def check_abort(self) -> None:
        """Raise :class:`connectors.errors.Aborted` if the run was aborted."""
        ...

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early (and raising ``Aborted``) if the run is aborted."""
        ...

    def rate_limit_slept(self, seconds: float) -> None:
        """A rate-limit wait of ``seconds`` was slept inside the job (counted in the worker's
        metrics; a wait in the queue is counted when the attempt ends)."""
        ...

    @property
    def max_inline_wait(self) -> float:
        """The longest rate-limit wait to sleep inside the run; longer ones requeue it."""
        ...

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        """Record that this connection's rate budget (see ``Connector.budget_key``) is spent
        until ``until``: no run drawing on it is claimed, and running ones wait, until then."""
        ...

    def rate_limited_until(self) -> datetime | None:
        """When the budget this connection draws on is free again, if another run found it
        spent; None when it is free now."""
        ...


class ConnectorContext(RequestContext, Protocol[ConfigT_co]):
    """The connection a connector reads for, and the engine services it may use. Generic over
    the connector's config model: ``ConnectorContext[GitHubConfig].config`` is a
    ``GitHubConfig``."""

    @property
    def config(self) -> ConfigT_co:
        """The connection's config, validated by the connector's ``config_model``."""
        ...

    @property
    def credentials(self) -> Mapping[str, Any]:
        """The decrypted credentials. Never log them."""
        ...

    def cursor(self, table: str, partition: str | None = None) -> Any | None:
        """The cursor saved by the last completed batch of an incremental table (of one of its
        partitions, when it is named). None also when the engine wants the whole table read:
        a first sync, and every sync of a table whose deletions only a complete listing shows
        (``Deletions.LISTING``), unless an operator's ``complete_every`` spaces them out."""
        ...

    def position(self, table: str, partition: str | None = None) -> Any | None:
        """The position an earlier attempt of this run saved for the table (or partition) it
        did not finish; None: start from the beginning."""
        ...

    @property
    def aborted(self) -> bool:
        """True once the run was cancelled, lost its lease, timed out or is shutting down."""
        ...

    def refresh_credentials(
        self, refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> Mapping[str, Any]:
        """Run ``refresh(current)`` under the connection's lock and save what it returns.

        ``current`` is the latest stored credentials (another run may have refreshed them); the
        result is encrypted and saved in a fenced write, then returned.
        """
        ...
