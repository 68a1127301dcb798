"""The engine's side of :class:`connectors.ConnectorContext` for one attempt of an ingestion
(or an archive expansion): what a connector's ``download`` needs, with every write it can make
(a refreshed token) fenced by the ingestion's lease instead of a run's.

A download has no cursor, no position and no ETag cache: it fetches the content of one stored
record. The abort signal is the ingestion's, tripped by its lease keeper (lost, cancelled,
timed out) and by the worker's shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from connectors.base import Connector
from connectors.context import CachedResponse
from connectors.errors import PermanentError
from sync.base.abort import AbortSignal
from sync.base.secrets import SecretBox
from sync.ingestions.store import IngestionStore
from sync.jobs.budgets import SharedBudget, shared_key
from sync.jobs.connectors import refresh_credentials
from sync.jobs.lease import Lease
from sync.store import RunStore
from sync.store.db import Connection, Pool


class EndpointContext:
    """The request context of the embeddings endpoint, for the attempts of one worker stage,
    one at a time (``serving``): a request checks, and its sleeps wake on, the abort signal of
    the attempt being served, so a cancel, a lost lease or a shutdown stops a request or a
    rate-limit wait; its log lines say which ingestion. The endpoint's rate limit is its own,
    not a connection's: a reported one is remembered here, and requests wait for it (or end
    the attempt, which is requeued until then, when it is longer than ``max_inline_wait``)."""

    def __init__(self, max_inline_wait: float) -> None:
        self._max_inline_wait = max_inline_wait
        self._stopper: AbortSignal | None = None
        self._logger: logging.LoggerAdapter[logging.Logger] = logging.LoggerAdapter(
            logging.getLogger("sync.ingestions"), {}
        )
        self._blocked_until: datetime | None = None

    @contextlib.contextmanager
    def serving(
        self, stopper: AbortSignal, logger: logging.LoggerAdapter[logging.Logger]
    ) -> Iterator[None]:
        before = self._stopper, self._logger
        self._stopper, self._logger = stopper, logger
        try:
            yield
        finally:
            self._stopper, self._logger = before

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        return self._logger

    @property
    def max_inline_wait(self) -> float:
        return self._max_inline_wait

    def check_abort(self) -> None:
        if self._stopper is not None:
            self._stopper.check()

    def sleep(self, seconds: float) -> None:
        stopper = self._stopper
        if stopper is None:
            time.sleep(seconds)
            return
        stopper.wait(seconds)
        stopper.check()

    def rate_limit_slept(self, seconds: float) -> None:
        return None  # ingestions export no rate-limit figures

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        if self._blocked_until is None or until > self._blocked_until:
            self._blocked_until = until
        self._logger.warning("the embeddings endpoint is rate limited until %s (%s)", until, reason)

    def rate_limited_until(self) -> datetime | None:
        until = self._blocked_until
        return until if until is not None and until > datetime.now(UTC) else None

    def cached_response(self, url: str) -> CachedResponse | None:
        return None

    def store_response(self, url: str, response: CachedResponse) -> None:
        return None


class IngestionContext:
    """A connector context for downloading one file of a connection."""

    def __init__(
        self,
        *,
        lease: Lease | None,
        connection_id: int,
        provider: str,
        budget_key: str | None,
        connector_class: type[Connector],
        config: BaseModel,
        credentials: Mapping[str, Any],
        stopper: AbortSignal,
        pool: Pool,
        secrets: SecretBox | None,
        max_inline_wait: float,
        logger: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self._lease = lease  # None for an archive expansion, which holds no lease
        self._connection_id = connection_id
        self._provider = provider
        self._connector_class = connector_class
        self._config = config
        self._credentials = credentials
        self._stopper = stopper
        self._pool = pool
        self._secrets = secrets
        self._max_inline_wait = max_inline_wait
        self._logger = logger
        self._budget = SharedBudget(RunStore(pool), shared_key(budget_key, connection_id))

    @property
    def config(self) -> BaseModel:
        return self._config

    @property
    def credentials(self) -> Mapping[str, Any]:
        return self._credentials

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        return self._logger

    def cursor(self, table: str, partition: str | None = None) -> Any | None:
        return None

    def position(self, table: str, partition: str | None = None) -> Any | None:
        return None

    def cached_response(self, url: str) -> CachedResponse | None:
        return None

    def store_response(self, url: str, response: CachedResponse) -> None:
        return None

    @property
    def aborted(self) -> bool:
        return self._stopper.is_set

    def check_abort(self) -> None:
        self._stopper.check()

    def sleep(self, seconds: float) -> None:
        if self._stopper.wait(seconds):
            self._stopper.check()
        self._stopper.check()

    @property
    def max_inline_wait(self) -> float:
        return self._max_inline_wait

    def refresh_credentials(
        self, refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> Mapping[str, Any]:
        lease = self._lease
        if lease is None:
            raise PermanentError("an archive expansion holds no lease to refresh credentials under")

        def lock(conn: Connection) -> bytes | None:
            return IngestionStore.lock_credentials(conn, lease, self._connection_id)

        self._credentials = refresh_credentials(
            self._pool,
            lock,
            refresh,
            connection_id=self._connection_id,
            connector_class=self._connector_class,
            provider=self._provider,
            config=self._config,
            secrets=self._secrets,
            logger=self._logger,
        )
        return self._credentials

    def rate_limit_slept(self, seconds: float) -> None:
        return None  # ingestions export no rate-limit figures

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        self._budget.spent_until(until, reason)
        self._logger.info("rate budget spent until %s: %s", until.isoformat(), reason)

    def rate_limited_until(self) -> datetime | None:
        return self._budget.free_at()
