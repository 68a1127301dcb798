"""Sync runs as a kind of leased work, run by the worker's main slot one at a time: claimed by
``claim_run``, handled by a sync (``sync.runs.sync``) or a purge (``sync.runs.purge``), decided by
the run's pure decision (``sync.runs.decide``), applied through the run store (requeue, wait for a
rate limit, hand back, finish). In the worker's loop the finish claims the worker's next run in
the same round trip, kept for the next claim; a bare ``poll()`` and a stopping worker leave
nothing claimed behind."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from prometheus_client import Counter

from sync.base.abort import AbortReason
from sync.jobs.kind import Handling, Hold, Kind, Labels
from sync.jobs.lease import Control, LeaseKind, Terms
from sync.jobs.metrics import PREFIX
from sync.jobs.outcome import Action, Outcome
from sync.jobs.registry import SlotSpec, WorkerParts
from sync.runs.decide import AttemptReport
from sync.runs.outcome import Outcomes, decide_run
from sync.runs.purge import purge
from sync.runs.sync import SyncJob
from sync.store import ClaimedRun, ClaimTerms, Lease, RetryPolicy, RunStore, Seal
from sync.store.db import Connection
from sync.vocabulary import RunKind

log = logging.getLogger("sync.run")


def renew_run(conn: Connection, lease: Lease, seconds: timedelta) -> bool:
    """Extend a run's lease; False means it is lost."""
    return RunStore.renew(conn, lease, seconds)


def read_run_control(conn: Connection, lease: Lease) -> Control:
    found = RunStore.control(conn, lease)
    if found is None:
        return Control(AbortReason.LEASE_LOST)
    stop = AbortReason.CANCELLED if found.cancel_requested else None
    return Control(stop)


RUN_LEASES = LeaseKind("run", renew=renew_run, control=read_run_control)


class Runs(Kind[ClaimedRun, AttemptReport]):
    name = "run"
    lease_kind = RUN_LEASES

    def __init__(self, parts: WorkerParts) -> None:
        settings = parts.settings
        self._settings = settings
        # An outcome is repeated while its connection is lost for most of a lease: the lease
        # keeper stops the run before the lease runs out.
        self.store = RunStore(parts.pool, retry=RetryPolicy(within=settings.lease_seconds * 0.8))
        self._outcomes = Outcomes(self.store)
        self._syncs = SyncJob(self.store, self._outcomes, settings, parts.secrets)
        self._terms = ClaimTerms(parts.worker_id, settings.lease_seconds, [])
        self._providers = parts.providers
        self._listening = parts.listening
        self._stopping = parts.stopping
        self._continuous = False  # in the worker's loop: the finish claims the next run
        self._prefetched: ClaimedRun | None = None
        self.current: ClaimedRun | None = None  # the run being handled, for the heartbeat
        registry = parts.metrics.registry
        self._records = Counter(
            f"{PREFIX}_records",
            "Records this worker's syncs upserted, left unchanged and tombstoned",
            ["provider", "outcome"],
            registry=registry,
        )
        self._waits = Counter(
            f"{PREFIX}_rate_limit_waits",
            "Waits for a spent rate limit: slept inside the run (where=inline), or ending the "
            "attempt while the run waits in the queue until it resets (where=queue)",
            ["provider", "where"],
            registry=registry,
        )
        self._waited = Counter(
            f"{PREFIX}_rate_limit_wait_seconds",
            "Seconds of those waits: slept inside the run, or that the run was told to wait",
            ["provider", "where"],
            registry=registry,
        )

    # -- the seam ----------------------------------------------------------------------------

    def claim(self, limit: int) -> Sequence[ClaimedRun]:
        run, self._prefetched = self._prefetched, None
        if run is None and not self._stopping():
            run = self.store.claim(self._claim_terms())
        return [run] if run is not None else []

    def holds(self, unit: ClaimedRun) -> Sequence[Hold]:
        return [Hold(unit.lease, Terms.of_runs(self._settings))]

    def labels(self, unit: ClaimedRun) -> Labels:
        ids = {"run_id": unit.id, "connection_id": unit.connection_id, "attempt": unit.attempts}
        return Labels(ids, unit.provider)

    def handle(self, unit: ClaimedRun, handling: Handling) -> AttemptReport:
        self.current = unit
        handling.log.info(
            "%s run started (attempt %d of %d)", unit.kind, unit.attempts, unit.max_attempts
        )
        try:
            if unit.kind == RunKind.PURGE:
                batch = self._settings.purge_batch_size
                return purge(unit, self.store, batch, handling.abort, handling.log)
            return self._syncs.run(unit, handling.abort, handling.log)
        finally:
            self.current = None

    def decide(
        self, unit: ClaimedRun, handled: AttemptReport, handling: Handling
    ) -> Sequence[Outcome]:
        return [decide_run(unit, handled, self._settings, self.store.now())]

    def apply(
        self,
        unit: ClaimedRun,
        handled: AttemptReport,
        outcomes: Sequence[Outcome],
        handling: Handling,
    ) -> None:
        (outcome,) = outcomes
        self._outcomes.apply(unit, outcome, handled, handling.log, seal=self._seal)
        self._count(unit, handled, outcome)
        # Seen keys serve every attempt of the run: they go when the run has ended.
        if handled.seen_keys_left and outcome.action is Action.FINISH:
            self._outcomes.clear_seen_keys(unit, handling.log)

    def hand_back(self, unit: ClaimedRun) -> None:
        seal = Seal(unit.lease, "queued", unit.results, {}, None)
        self.store.hand_back(seal, timeout=5, repeat=False)
        log.info("handed back run %d, claimed but not started", unit.id)

    def start(self) -> None:
        self._continuous = True

    def stop(self) -> None:
        self._continuous = False
        run, self._prefetched = self._prefetched, None
        if run is not None:
            self.hand_back(run)

    # -- its own ---------------------------------------------------------------------------

    def _claim_terms(self) -> ClaimTerms:
        """The claim's terms as of now: an empty claim may mark this worker idle, to be woken
        alone on its own channel, only while its loop runs and its LISTEN connection is up."""
        return replace(
            self._terms,
            providers=list(self._providers()),
            wakeable=self._continuous and self._listening(),
        )

    def _seal(self, seal: Seal) -> bool:
        """The finish of the run just handled. In the loop it claims the next run in the same
        round trip (kept for the next claim); a bare poll (tests, ``worker --once``) and a
        worker asked to stop leave nothing claimed behind."""
        if not self._continuous or self._stopping():
            return self.store.finish(seal)
        sealed, self._prefetched = self.store.finish_and_claim(seal, self._claim_terms())
        return sealed

    def _count(self, unit: ClaimedRun, handled: AttemptReport, outcome: Outcome) -> None:
        """A run's own figures: its records, its rate-limit waits (those slept inside the
        attempt, and the one it ends with)."""
        provider = unit.provider
        tables = handled.own.values()
        if tables:
            self._records.labels(provider, "upserted").inc(sum(t.upserted for t in tables))
            self._records.labels(provider, "unchanged").inc(sum(t.unchanged for t in tables))
            self._records.labels(provider, "tombstoned").inc(sum(t.tombstoned for t in tables))
        for seconds in handled.waits_slept:
            self._waits.labels(provider, "inline").inc()
            self._waited.labels(provider, "inline").inc(seconds)
        if outcome.action is Action.WAIT:
            self._waits.labels(provider, "queue").inc()
            self._waited.labels(provider, "queue").inc(outcome.delay or 0.0)


def slots(parts: WorkerParts) -> Sequence[SlotSpec]:
    """The worker's main slot: its sync runs, one at a time, in its loop."""
    return [SlotSpec(Runs(parts), lanes=1, main=True)]
