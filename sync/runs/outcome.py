"""A run's outcome: the decision about its fate (``sync.runs.decide``, given what this run
is) and its application through the store: requeue, wait for a rate limit, hand back, or
finish. The finish goes through a ``seal``, which in the worker's loop claims the worker's next
run in the same round trip."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from sync.base.abort import AbortReason, AbortSignal
from sync.base.settings import Settings
from sync.jobs.log import Logger
from sync.jobs.outcome import Action, Outcome
from sync.runs.decide import AttemptReport, TableResult, Waiting, decide
from sync.store import ClaimedRun, RunStore, Seal
from sync.store.db import first_line
from sync.vocabulary import ErrorKind, RunKind, RunStatus, TableStatus

Sealer = Callable[[Seal], bool]
"""Seals a finished run; False when its lease was lost first."""


def decide_run(run: ClaimedRun, done: AttemptReport, settings: Settings, now: datetime) -> Outcome:
    """The decision for ``run`` after an attempt (pure): its attempts, its backoff, and (a
    sync) how long it may wait for a rate limit."""
    return decide(
        done.results,
        attempts=run.attempts,
        max_attempts=run.max_attempts,
        abort=done.abort,
        run_error=done.error,
        schedule=settings.backoff_seconds,
        jitter=settings.backoff_jitter,
        waiting=Waiting(
            waiting_for=f"the {run.provider} rate limit",
            started_at=run.started_at or now,
            waits=run.waits,
            now=now,
            deadline=timedelta(seconds=settings.run_deadline),
        )
        if run.kind == RunKind.SYNC
        else None,
    )


def _json(results: dict[str, TableResult]) -> dict[str, Any]:
    return {name: r.to_json() for name, r in results.items()}


class Outcomes:
    """Applies a run's outcome, and keeps what a run gathers along the way."""

    def __init__(self, store: RunStore) -> None:
        self._store = store

    def apply(
        self,
        run: ClaimedRun,
        outcome: Outcome,
        done: AttemptReport,
        logger: Logger,
        *,
        seal: Sealer | None = None,
    ) -> None:
        if outcome.action is Action.STOP:
            logger.warning("stopped: the lease was lost, so this attempt writes nothing more")
            return
        processed = done.processed
        sealed_results = _json(done.results)
        own_results = _json(done.own)
        if outcome.action is Action.FINISH and outcome.status is RunStatus.FAILED:
            for value in (*sealed_results.values(), *own_results.values()):
                if value["status"] == TableStatus.RETRY:
                    value["status"] = TableStatus.FAILED
        ending = Seal(
            lease=run.lease,
            status=outcome.status or "",
            results=sealed_results,
            attempt_results=own_results,
            error=outcome.error.to_json() if outcome.error else None,
            processed_units=processed,
            disconnect=outcome.error is not None and outcome.error.kind is ErrorKind.AUTH,
        )
        ended: str | None
        if outcome.action is Action.HAND_BACK:
            ended = RunStatus.QUEUED if self._store.hand_back(ending) else None
        elif outcome.action is Action.REQUEUE:
            ended = self._store.requeue(ending, outcome.delay or 0)
        elif outcome.action is Action.WAIT:
            ended = self._store.wait_for_rate_limit(
                ending, outcome.delay or 0, outcome.waiting_for or ""
            )
        else:
            sealer = seal or self._store.finish
            ended = outcome.status if sealer(ending) else None
        if ended is None:
            logger.warning("the lease was lost before the run could be %s", outcome.action.value)
        elif outcome.action is Action.REQUEUE and ended == RunStatus.QUEUED:
            logger.info("requeued to retry in %.1f s: %s", outcome.delay or 0, outcome.error)
        elif outcome.action is Action.WAIT and ended == RunStatus.QUEUED:
            logger.info("waiting %.0f s for %s", outcome.delay or 0, outcome.waiting_for)
        else:
            logger.info("run ended %s", ended)

    def save_results(
        self,
        run: ClaimedRun,
        results: dict[str, TableResult],
        attempt_results: dict[str, TableResult],
        abort: AbortSignal,
    ) -> None:
        """Keep the results gathered so far, so a crash or cancel keeps them."""
        try:
            held = self._store.save_results(run.lease, _json(results), _json(attempt_results))
        except psycopg.Error:
            return  # the finish writes them again
        if not held:
            abort.trip(AbortReason.LEASE_LOST)

    def clear_seen_keys(self, run: ClaimedRun, logger: Logger) -> None:
        try:
            self._store.clear_seen_keys(run.id)
        except psycopg.Error as exc:  # the sweep stage collects them later
            logger.warning("could not clear seen keys: %s", first_line(exc))
