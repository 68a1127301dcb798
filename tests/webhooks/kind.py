"""Webhook deliveries as a kind: a claim takes due deliveries; handling one POSTs its body to its
URL (through httpx, honouring the attempt's abort signal); the decision is pure (2xx delivered;
a 5xx or a network error retried with the engine's one backoff while attempts remain; any other
answer failed); the writes are fenced by the delivery's lease owner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from psycopg.types.json import Jsonb

from sync.base.abort import AbortReason
from sync.jobs.kind import Handling, Hold, Kind, Labels
from sync.jobs.lease import Control, LeaseKind, Terms
from sync.jobs.outcome import Action, Backoff, Outcome
from sync.jobs.registry import SlotSpec, WorkerParts
from sync.store.db import Connection, Pool
from sync.store.queries import parse
from sync.store.rows import Lease
from sync.vocabulary import ErrorKind, JobError

STATEMENTS = {
    name: query.sql
    for name, query in parse((Path(__file__).parent / "deliveries.sql").read_text()).items()
}
BACKOFF = Backoff(steps=(1.0, 5.0, 30.0))
LEASE_SECONDS = 30.0


def renew(conn: Connection, lease: Lease, seconds: timedelta) -> bool:
    params = {"id": lease.id, "owner": lease.owner, "lease": seconds}
    return conn.execute(STATEMENTS["renew"], params).fetchone() is not None


def control(conn: Connection, lease: Lease) -> Control:
    row = conn.execute(STATEMENTS["control"], {"id": lease.id, "owner": lease.owner}).fetchone()
    if row is None:
        return Control(AbortReason.LEASE_LOST)
    return Control(AbortReason.CANCELLED if row["cancel_requested"] else None)


LEASES = LeaseKind("webhook", renew=renew, control=control)


@dataclass(frozen=True)
class Sent:
    status: int | None  # the receiver's answer; None: it could not be reached
    error: str | None = None


def decide(delivery: dict[str, Any], sent: Sent, abort: AbortReason | None) -> Outcome:
    """What becomes of a delivery after an attempt (pure)."""
    if abort is AbortReason.LEASE_LOST:
        return Outcome(Action.STOP)
    if abort is AbortReason.SHUTDOWN:
        return Outcome(Action.HAND_BACK)
    if abort is AbortReason.CANCELLED:
        return Outcome(Action.FINISH, "cancelled", error=JobError(ErrorKind.CANCELLED, "cancelled"))
    if sent.status is not None and 200 <= sent.status < 300:
        return Outcome(Action.FINISH, "delivered")
    error = JobError(ErrorKind.RETRYABLE, sent.error or f"the receiver answered {sent.status}")
    retryable = sent.status is None or sent.status >= 500
    if retryable and delivery["attempts"] < delivery["max_attempts"]:
        return Outcome(Action.REQUEUE, delay=BACKOFF.delay(delivery["attempts"]), error=error)
    return Outcome(Action.FINISH, "failed", error=error)


class Deliveries(Kind[dict[str, Any], Sent]):
    name = "webhook"
    lease_kind = LEASES

    def __init__(self, pool: Pool, control_interval: float) -> None:
        self._pool = pool
        self._terms = Terms(LEASE_SECONDS, control_interval, timeout_seconds=60.0)

    def claim(self, limit: int) -> Sequence[dict[str, Any]]:
        params = {"limit": limit, "lease": timedelta(seconds=LEASE_SECONDS)}
        with self._pool.connection() as conn:
            return list(conn.execute(STATEMENTS["claim"], params).fetchall())

    def holds(self, unit: dict[str, Any]) -> Sequence[Hold]:
        return [Hold(Lease(unit["id"], unit["lease_owner"]), self._terms)]

    def labels(self, unit: dict[str, Any]) -> Labels:
        return Labels({"delivery_id": unit["id"], "attempt": unit["attempts"]}, "webhooks")

    def handle(self, unit: dict[str, Any], handling: Handling) -> Sent:
        handling.abort.check()
        try:
            response = httpx.post(unit["url"], json=unit["body"], timeout=10.0)
        except httpx.HTTPError as exc:
            return Sent(None, f"{type(exc).__name__}: {exc}")
        return Sent(response.status_code)

    def decide(self, unit: dict[str, Any], handled: Sent, handling: Handling) -> Sequence[Outcome]:
        return [decide(unit, handled, handling.abort.reason)]

    def apply(
        self, unit: dict[str, Any], handled: Sent, outcomes: Sequence[Outcome], handling: Handling
    ) -> None:
        (outcome,) = outcomes
        fence = {"id": unit["id"], "owner": unit["lease_owner"]}
        error = outcome.error.message if outcome.error else None
        with self._pool.connection() as conn:
            if outcome.action is Action.FINISH:
                params = {**fence, "status": outcome.status, "error": error}
                conn.execute(STATEMENTS["finish"], params)
            elif outcome.action is not Action.STOP:
                spend = outcome.action is Action.REQUEUE
                params = {**fence, "error": error, "delay": outcome.delay or 0.0, "spend": spend}
                conn.execute(STATEMENTS["requeue"], params)
        handling.log.info("delivery %s", outcome.label)

    def hand_back(self, unit: dict[str, Any]) -> None:
        fence = {"id": unit["id"], "owner": unit["lease_owner"]}
        with self._pool.connection() as conn:
            conn.execute(
                STATEMENTS["requeue"], {**fence, "error": None, "delay": 0.0, "spend": False}
            )


def slots(parts: WorkerParts) -> Sequence[SlotSpec]:
    """One lane of deliveries on every worker."""
    return [SlotSpec(Deliveries(parts.pool, parts.settings.control_interval), lanes=1)]


def enqueue(pool: Pool, url: str, body: dict[str, Any]) -> int:
    with pool.connection() as conn:
        conn.execute(STATEMENTS["create_table"])
        row = conn.execute(STATEMENTS["enqueue"], {"url": url, "body": Jsonb(body)}).fetchone()
    assert row is not None
    return int(row["id"])
