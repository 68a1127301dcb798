"""Shared rate budgets: the key under which connections that spend one provider budget (one
token, one OAuth app, one tenant) are throttled together, what a run knows of when its budget
is free again, and the one rule every job that talks to a provider follows: a window any worker
heard of (a Retry-After, a reset, a spent remaining count) holds every request of the budget,
on every worker, until it ends."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from connectors.base import Connector
from sync.base import redact
from sync.store import RunStore


def budget_key_of(
    cls: type[Connector[Any]],
    provider: str,
    config: BaseModel,
    credentials: Mapping[str, Any],
) -> str | None:
    """The hashed rate-budget key of a connection: never the connector's raw key, which may be
    derived from a secret."""
    key = cls.budget_key(config, credentials)
    if key is None:
        return None
    return f"{provider}:{hashlib.sha256(key.encode()).hexdigest()[:24]}"


class BudgetView:
    """When the run's shared rate budget is free again; kept fresh by the lease keeper's
    control read and by the run's own reports."""

    def __init__(self) -> None:
        self.until: datetime | None = None
        self.waits_slept: list[float] = []  # rate-limit waits slept inside this attempt

    def slept(self, seconds: float) -> None:
        self.waits_slept.append(seconds)

    def spent_until(self, until: datetime | None) -> None:
        """The budget is spent until ``until``: a block only ever gets longer."""
        if until is not None and (self.until is None or until > self.until):
            self.until = until


def shared_key(budget_key: str | None, connection_id: int) -> str:
    """The key a connection's requests are throttled under: the provider's budget its connector
    names, else the connection's own."""
    return budget_key or f"connection:{connection_id}"


class SharedBudget:
    """The shared rate budget one job's provider requests draw on (a sync's pages and deletion
    checks, a token refresh, an ingestion's download). A window the provider announces is
    recorded for every worker at once; before each request the budget is read from the
    database, so a request waits for a window another worker heard of a moment ago, not only
    for one a control read brought in."""

    def __init__(self, store: RunStore, key: str, view: BudgetView | None = None) -> None:
        self._store = store
        self._key = key
        self.view = view or BudgetView()

    def spent_until(self, until: datetime, reason: str) -> None:
        self.view.spent_until(until)
        self._store.block_rate_budget(self._key, until, redact.redact(reason))

    def free_at(self) -> datetime | None:
        """When the budget is free again; None when it is free now."""
        self.view.spent_until(self._store.rate_budget_until(self._key))
        until = self.view.until
        return until if until is not None and until > self._store.now() else None
