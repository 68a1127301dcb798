"""Executes one claimed run: holds its lease with the worker's lease keeper (one abort signal
for the connector, the HTTP client and the record writer), runs its job (``sync.runs.sync``
or ``sync.runs.purge``), and applies the outcome (``sync.runs.outcome``). It never claims: the
finish goes through the ``seal`` the worker passes, which may claim the worker's next run in
the same round trip."""

from __future__ import annotations

import time

from sync.base import tracing
from sync.base.abort import AbortSignal
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.jobs.budgets import BudgetView
from sync.jobs.lease import LeaseKeeper
from sync.jobs.metrics import WorkerMetrics, outcome_label
from sync.jobs.outcome import Action, Outcome, TableResult
from sync.runs.log import run_log
from sync.runs.outcome import Outcomes, Sealer, decider
from sync.runs.purge import purge
from sync.runs.sync import SyncJob
from sync.store import ClaimedRun, RunStore
from sync.vocabulary import RunKind


class Executor:
    def __init__(
        self,
        store: RunStore,
        settings: Settings,
        secrets: SecretBox | None,
        keeper: LeaseKeeper,
        worker_id: str,
        *,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._store = store
        self._settings = settings
        self._keeper = keeper
        self._worker_id = worker_id
        self._outcomes = Outcomes(store)
        self._syncs = SyncJob(store, self._outcomes, settings, secrets)
        self.current: AbortSignal | None = None

    def execute(self, run: ClaimedRun, *, seal: Sealer | None = None) -> None:
        """Run one claimed run to its end and apply the outcome; a finish goes through
        ``seal`` (by default, the store's plain finish)."""
        abort = AbortSignal()
        budget = BudgetView()
        logger = run_log(run.id, run.connection_id, run.attempts, self._worker_id)
        self.current = abort
        seen_keys_left = False
        watch = self._keeper.watch(run.lease, abort, on_control=budget.learn, logger=logger)
        logger.info("%s run started (attempt %d of %d)", run.kind, run.attempts, run.max_attempts)
        outcome: Outcome | None = None
        attempt: dict[str, TableResult] = {}
        started = time.monotonic()
        span = tracing.begin(
            f"connector_sync.{run.kind}",
            {
                "connector_sync.run_id": run.id,
                "connector_sync.connection_id": run.connection_id or 0,
                "connector_sync.provider": run.provider,
                "connector_sync.attempt": run.attempts,
                "connector_sync.worker_id": self._worker_id,
            },
        )
        try:
            if run.kind == RunKind.PURGE:
                decide = decider(run, self._settings, self._store)
                batch = self._settings.purge_batch_size
                outcome, results, processed = purge(run, self._store, batch, abort, logger, decide)
            else:
                outcome, results, attempt = self._syncs.run(run, abort, budget, logger)
                seen_keys_left = self._syncs.seen_keys_left
                processed = None
            self._outcomes.apply(run, outcome, results, attempt, processed, logger, seal=seal)
        finally:
            self._keeper.release(watch)
            self.current = None
            if self._metrics is not None:
                elapsed = time.monotonic() - started
                self._metrics.attempt_ended(
                    run.kind, run.provider, outcome, elapsed, attempt, budget.waits_slept
                )
            ended = outcome_label(outcome)
            failed = ended in ("failed", "error", "requeue")
            tracing.end(
                span,
                {"connector_sync.outcome": ended},
                error=_span_error(outcome) if failed else None,
            )
            # Seen keys serve every attempt of the run: they go when the run has ended.
            if seen_keys_left and outcome is not None and outcome.action is Action.FINISH:
                self._outcomes.clear_seen_keys(run, logger)


def _span_error(outcome: Outcome | None) -> str:
    if outcome is None:
        return "the attempt raised"
    if outcome.error is not None:
        return outcome.error.message or outcome_label(outcome)
    return outcome_label(outcome)
