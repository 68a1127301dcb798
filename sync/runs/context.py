"""What a sync's connector sees of the engine (:class:`connectors.ConnectorContext`) for one
attempt: its config and credentials, cursors and positions, the ETag cache, the abort signal,
waits, credential refreshes under the connection's row lock, and the shared rate budget."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from connectors.base import Connector
from connectors.context import CachedResponse
from sync.base.abort import AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.jobs.budgets import BudgetView, SharedBudget, shared_key
from sync.jobs.connectors import refresh_credentials
from sync.jobs.log import Logger
from sync.runs.checkpoints import RunCheckpoints
from sync.runs.http_cache import HttpCache
from sync.store import ClaimedRun, RunStore


class RunContext:
    """The engine's side of :class:`connectors.ConnectorContext` for one attempt."""

    def __init__(
        self,
        *,
        run: ClaimedRun,
        connector_class: type[Connector],
        config: BaseModel,
        credentials: Mapping[str, Any],
        cursors: dict[str, Any],
        abort: AbortSignal,
        budget: BudgetView,
        store: RunStore,
        secrets: SecretBox | None,
        settings: Settings,
        logger: Logger,
        checkpoints: RunCheckpoints | None = None,
        cache: HttpCache | None = None,
    ) -> None:
        self._run = run
        self._connector_class = connector_class
        self._config = config
        self._credentials = credentials
        self._cursors = cursors
        self._checkpoints = checkpoints or RunCheckpoints()
        self._cache = cache
        # The slices (table, partition or '') whose periodic complete pass is due: their
        # cursors are withheld.
        self._withheld: set[tuple[str, str]] = set()
        self._abort = abort
        assert run.connection_id is not None
        self._budget = SharedBudget(store, shared_key(run.budget_key, run.connection_id), budget)
        self._store = store
        self._secrets = secrets
        self._settings = settings
        self._logger = logger

    @property
    def config(self) -> BaseModel:
        return self._config

    @property
    def credentials(self) -> Mapping[str, Any]:
        return self._credentials

    @property
    def logger(self) -> Logger:
        return self._logger

    def withhold(self, table: str, slices: set[str]) -> None:
        """The cursors of these slices of ``table`` are withheld: they are read completely."""
        self._withheld |= {(table, name) for name in slices}

    def cursor(self, table: str, partition: str | None = None) -> Any | None:
        if (table, partition or "") in self._withheld:
            return None
        saved = self._cursors.get(table)
        if partition is None:
            return saved
        return saved.get(partition) if isinstance(saved, dict) else None

    def position(self, table: str, partition: str | None = None) -> Any | None:
        return self._checkpoints.position(table, partition)

    def cached_response(self, url: str) -> CachedResponse | None:
        return self._cache.get(url) if self._cache is not None else None

    def store_response(self, url: str, response: CachedResponse) -> None:
        if self._cache is not None:
            self._cache.put(url, response)

    @property
    def aborted(self) -> bool:
        return self._abort.is_set

    def check_abort(self) -> None:
        self._abort.check()

    def sleep(self, seconds: float) -> None:
        if self._abort.wait(seconds):
            self._abort.check()

    @property
    def max_inline_wait(self) -> float:
        return self._settings.max_inline_wait

    def refresh_credentials(
        self, refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ) -> Mapping[str, Any]:
        connection_id = self._run.connection_id
        assert connection_id is not None
        self._credentials = refresh_credentials(
            self._store.pool,
            lambda conn: self._store.lock_credentials(conn, self._run.lease, connection_id),
            refresh,
            connection_id=connection_id,
            connector_class=self._connector_class,
            provider=self._run.provider,
            config=self._config,
            secrets=self._secrets,
            logger=self._logger,
        )
        return self._credentials

    def rate_limit_slept(self, seconds: float) -> None:
        self._budget.view.slept(seconds)

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        self._budget.spent_until(until, reason)
        self._logger.info("rate budget spent until %s: %s", until.isoformat(), reason)

    def rate_limited_until(self) -> datetime | None:
        return self._budget.free_at()
