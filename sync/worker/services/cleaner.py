"""Retention: what the cleaner deletes, and the cleaner, which one worker of the fleet runs every
``clean_interval``.

A pass deletes, in batches of ``retention_batch`` rows, each its own short transaction:

- finished runs (succeeded, partial, failed, cancelled) that finished more than ``history_days``
  ago, except the ``history_keep_runs`` newest runs of each connection, with their attempts and
  checkpoints; runs of a deleted connection go by age alone;
- workers stopped, or silent without recording a stop, for more than ``stopped_worker_days``;
- rate budgets whose block has ended;
- ETag cache entries nobody asked for in ``http_cache_days`` (responses to URLs that are never
  asked again: a listing whose query changes with every sync);
- seen keys of runs that are neither queued nor running (the sweeper's work, done here too so
  that the keys of the runs this pass deleted go with them);
- finished application jobs (completed, dead, cancelled) older than the ``retention`` of the
  queue they are in, with their attempts: the rule the lanes apply, run here too so that it
  holds when no worker runs lanes (a dead job is in its dead-letter queue, whose retention
  keeps it);
- finished ingestions (ready, skipped, failed, cancelled) that finished more than
  ``history_days`` ago; an archive stays while a member file of it is queued or running, and
  the documents they indexed stay;
- only when ``tombstone_days`` is set, records tombstoned longer ago than that.

Nothing a live run needs is deleted: a run that is waiting, queued or running is never deleted
whatever its age, nor its attempts, checkpoints or seen keys; each statement re-checks on the row
it deletes the condition that made it deletable (see ``sql/maintenance.sql``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from sync.base.settings import Settings
from sync.jobs.service import Ticks
from sync.store.db import Pool
from sync.store.maintenance import Batch, MaintenanceStore, RunPosition
from sync.worker.services.fleet_task import FleetTask

log = logging.getLogger("sync.worker")

DAY = timedelta(days=1)


class Retained(StrEnum):
    """The kinds of rows retention deletes, in the order a pass deletes them."""

    RUNS = "runs"
    ATTEMPTS = "attempts"
    SEEN_KEYS = "seen_keys"
    WORKERS = "workers"
    RATE_BUDGETS = "rate_budgets"
    HTTP_CACHE = "http_cache"
    JOBS = "jobs"
    JOB_ATTEMPTS = "job_attempts"
    INGESTIONS = "ingestions"
    TOMBSTONES = "tombstones"


@dataclass(frozen=True)
class RetentionRules:
    history: timedelta
    keep_runs: int
    stopped_workers: timedelta
    tombstones: timedelta | None  # None: tombstoned records are kept
    batch: int
    http_cache: timedelta  # ETag cache entries unused for this long are deleted

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionRules:
        return cls(
            history=settings.history_days * DAY,
            keep_runs=settings.history_keep_runs,
            stopped_workers=settings.stopped_worker_days * DAY,
            tombstones=None if settings.tombstone_days is None else settings.tombstone_days * DAY,
            batch=settings.retention_batch,
            http_cache=settings.http_cache_days * DAY,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "history_days": self.history / DAY,
            "history_keep_runs": self.keep_runs,
            "stopped_worker_days": self.stopped_workers / DAY,
            "tombstone_days": None if self.tombstones is None else self.tombstones / DAY,
            "retention_batch": self.batch,
            "http_cache_days": self.http_cache / DAY,
        }


@dataclass
class PruneReport:
    """What one pass deleted (or, dry, would delete), per kind, and in how many statements."""

    dry_run: bool
    rules: RetentionRules
    deleted: dict[Retained, int] = field(default_factory=lambda: dict.fromkeys(Retained, 0))
    statements: int = 0
    complete: bool = True  # False: the pass was stopped before it was done

    def counts(self) -> dict[str, int]:
        return {str(kind): count for kind, count in self.deleted.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "complete": self.complete,
            "deleted": self.counts(),
            "statements": self.statements,
            "rules": self.rules.to_json(),
        }


def prune(
    store: MaintenanceStore,
    rules: RetentionRules,
    *,
    dry_run: bool = False,
    stopping: Callable[[], bool] = lambda: False,
) -> PruneReport:
    """One pass of retention. Each batch takes a pooled connection for one statement and gives
    it back, so a long pass never holds a connection or a lock between batches. ``stopping``
    is asked between batches: a worker that is stopping ends its pass there."""
    report = PruneReport(dry_run=dry_run, rules=rules)
    delete = not dry_run
    # Without deleting, the batches would find the same rows again: one count per kind instead
    # (finished runs are walked by position either way).
    limit = rules.batch if delete else None

    def stopped() -> bool:
        if stopping():
            report.complete = False
        return not report.complete

    position: RunPosition | None = RunPosition()
    while position is not None and not stopped():
        runs = store.prune_runs(
            older_than=rules.history,
            keep=rules.keep_runs,
            limit=rules.batch,
            after=position,
            delete=delete,
        )
        report.statements += 1
        report.deleted[Retained.RUNS] += runs.runs
        report.deleted[Retained.ATTEMPTS] += runs.attempts
        position = runs.next

    def each(kind: Retained, batch: Callable[[], Batch]) -> None:
        while not stopped():
            found = batch()
            report.statements += 1
            report.deleted[kind] += found.deleted if delete else found.found
            if limit is None or found.found < limit:
                return

    each(Retained.SEEN_KEYS, lambda: store.prune_seen_keys(limit=limit, delete=delete))
    each(
        Retained.WORKERS,
        lambda: store.prune_workers(older_than=rules.stopped_workers, limit=limit, delete=delete),
    )
    each(Retained.RATE_BUDGETS, lambda: store.prune_rate_budgets(limit=limit, delete=delete))
    each(
        Retained.HTTP_CACHE,
        lambda: store.prune_http_cache(older_than=rules.http_cache, limit=limit, delete=delete),
    )

    def jobs() -> Batch:
        found = store.prune_jobs(limit=limit, delete=delete)
        report.deleted[Retained.JOB_ATTEMPTS] += found.attempts
        return Batch(found.found, found.deleted)

    each(Retained.JOBS, jobs)
    each(
        Retained.INGESTIONS,
        lambda: store.prune_ingestions(older_than=rules.history, limit=limit, delete=delete),
    )
    if rules.tombstones is not None:
        tombstones = rules.tombstones
        each(
            Retained.TOMBSTONES,
            lambda: store.prune_tombstones(older_than=tombstones, limit=limit, delete=delete),
        )
    return report


class Cleaner(FleetTask):
    """Runs :func:`prune` when this worker takes the retention task (once per ``clean_interval``
    across the fleet)."""

    name = "cleaner"
    task = "retention"

    def __init__(
        self, pool: Pool, settings: Settings, *, worker_id: str, clock: Ticks = time.monotonic
    ) -> None:
        super().__init__(
            pool, settings.clean_interval, settings.max_backoff, worker_id=worker_id, clock=clock
        )
        self._rules = RetentionRules.from_settings(settings)

    def _pass(self) -> dict[str, int]:
        report = prune(self._store, self._rules, stopping=self._stopping.is_set)
        if any(report.deleted.values()):
            log.info(
                "retention deleted %s in %d statement(s)",
                ", ".join(f"{n} {kind}" for kind, n in report.deleted.items() if n),
                report.statements,
            )
        return report.counts()
