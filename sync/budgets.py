"""Shared rate budgets: the key under which connections that spend one provider budget (one
token, one OAuth app, one tenant) are throttled together, and what a run knows of when its
budget is free again."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from connectors.base import Connector
from sync.lease import Control


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

    def learn(self, control: Control) -> None:
        """What a control read says of the budget: a block only ever gets longer."""
        self.spent_until(control.budget_blocked_until)

    def spent_until(self, until: datetime | None) -> None:
        """The budget is spent until ``until``: a block only ever gets longer."""
        if until is not None and (self.until is None or until > self.until):
            self.until = until
