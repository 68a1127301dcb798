"""Application jobs as a kind of leased work: one slot per queue a worker serves, with the lanes
``CONNECTOR_SYNC_LANES`` gives it. A lane's claim takes due jobs of its queue (a batch, on a
queue with a batch handler); the handler runs; the job's fate is the queue's pure decision
(:func:`sync.queues.retries.fate_after`); a completion is handed to :class:`Completions`, which
writes it with the others that return within a couple of milliseconds, so the lane claims again
at once. The queues' cron fires on a service of its own, once a second."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from sync.base.abort import AbortReason
from sync.base.settings import Settings
from sync.base.signals import TestSignal
from sync.jobs.kind import Handling, Hold, Kind, Labels
from sync.jobs.lease import Control, LeaseKind, Terms
from sync.jobs.outcome import Outcome
from sync.jobs.registry import SlotSpec, WorkerParts
from sync.jobs.service import Service
from sync.queues.lanes import parse_lanes, served_queues
from sync.queues.models import JobStatus, QueuePolicy
from sync.queues.postgres import PostgresQueues, RunningJob
from sync.queues.store import JobStore
from sync.store.db import Connection, first_line
from sync.store.rows import Lease

log = logging.getLogger("sync.job")

# Seconds a completion waits for others to share its statement and its commit (as
# graphile-worker's completeJobBatchDelay): short jobs return many times within it, so many share
# one commit. A job's lease runs for seconds, so the wait changes nothing else.
COMPLETION_DELAY = 0.002


def renew_job(conn: Connection, lease: Lease, seconds: timedelta) -> bool:
    """Extend an application job's attempt, never past the queue's expire; False: lost."""
    return JobStore.renew(conn, lease.id, lease.owner, seconds)


def read_job_control(conn: Connection, lease: Lease) -> Control:
    return _job_control(JobStore.control(conn, lease.id, lease.owner))


def _job_control(found: tuple[JobStatus, bool] | None) -> Control:
    if found is None or not found[1]:
        return Control(AbortReason.LEASE_LOST)
    status = found[0]
    if status is JobStatus.CANCELLED:
        return Control(AbortReason.CANCELLED)
    return Control(None if status is JobStatus.ACTIVE else AbortReason.LEASE_LOST)


def renew_jobs(conn: Connection, leases: list[tuple[Lease, timedelta]]) -> set[Lease]:
    renewed = JobStore.renew_many(conn, [(lease.id, lease.owner, n) for lease, n in leases])
    return {lease for lease, _ in leases if (lease.id, lease.owner) in renewed}


def read_job_controls(conn: Connection, leases: list[Lease]) -> dict[Lease, Control]:
    found = JobStore.control_many(conn, [(lease.id, lease.owner) for lease in leases])
    return {lease: _job_control(found.get((lease.id, lease.owner))) for lease in leases}


# A worker holds many leases of jobs at once: the keeper renews and controls those due
# together in one statement each.
JOB_LEASES = LeaseKind(
    "job",
    renew=renew_job,
    control=read_job_control,
    renew_many=renew_jobs,
    control_many=read_job_controls,
)


class Completions:
    """Completions of attempts whose handlers returned, written together: one thread flushes,
    in one statement, whatever the lanes handed over while its previous flush ran and within
    ``delay`` of the first of them (as graphile-worker batches its completions), so a lane
    goes back to claiming at once and many short jobs share a commit. A write that fails for a
    passing reason is repeated by the store's :class:`~sync.store.retry.RetryPolicy`; one that
    fails for good is left to the jobs' leases, which run out and let a claim run them again.
    ``stop()`` writes what is pending at once."""

    def __init__(self, queues: PostgresQueues, delay: float = COMPLETION_DELAY) -> None:
        self._queues = queues
        self._delay = delay
        self._cond = threading.Condition()
        self._pending: list[RunningJob] = []
        self._flushing = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.flushed = TestSignal()  # emitted after each batch of completions is written
        # Emitted when a completion has come and the thread waits for others to join it.
        self.collecting = TestSignal()

    def submit_many(self, attempts: list[RunningJob]) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="completions", daemon=True)
                self._thread.start()
            # Only a thread waiting for a first completion needs waking: one that collects
            # others wakes at the end of its delay anyway.
            if not self._pending:
                self._cond.notify()
            self._pending.extend(attempts)

    def stop(self) -> None:
        """Write what is pending, then end the thread (the next completion starts another)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._pending:
                    self.collecting.emit()
                deadline = time.monotonic() + self._delay
                while not self._stopping and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch, self._pending = self._pending, []
                if not batch and self._stopping:
                    return
                self._flushing = True
            try:
                self._queues.complete_many(batch)
            except Exception as exc:  # their leases run out; a claim runs them again
                log.warning("completing %d job(s) failed: %s", len(batch), first_line(exc))
                continue
            finally:
                with self._cond:
                    self._flushing = False
            self.flushes += 1
            self.flushed.emit()

    def busy(self) -> bool:
        """Whether completions are waiting to be written or being written."""
        with self._cond:
            return bool(self._pending) or self._flushing


Unit = list[RunningJob]
"""A claimed unit of a queue: one job, or the batch a batch handler takes at once."""


class QueueJobs(Kind[Unit, str | None]):
    """The jobs of one queue. What handling gives is what the handler raised, in one line, or
    None when it returned."""

    name = "job"
    lease_kind = JOB_LEASES

    def __init__(
        self,
        queues: PostgresQueues,
        queue: str,
        settings: Settings,
        completions: Completions,
        *,
        limited: bool = False,
    ) -> None:
        self.queues = queues
        self.queue = queue
        self._settings = settings
        self.completions = completions
        # The queue has a fleet-wide concurrency limit: a claim that finds it full while this
        # worker's own jobs of it are ending waits for their completions, then claims again.
        self.limited = limited
        self._held = 0  # jobs of the queue this worker claimed and has not ended yet
        self._held_lock = threading.Lock()
        registration = queues.handlers.get(queue)
        self.batch = None if registration is None else registration.batch

    def claim(self, limit: int) -> Sequence[Unit]:
        seen = self.completions.flushed.count
        units = self._claim(limit)
        if units or not self.limited:
            return units
        with self._held_lock:
            ours = self._held
        if ours or self.completions.busy() or self.completions.flushed.count > seen:
            # Room comes back when our own jobs' completions are written, not at the next poll.
            self.completions.flushed.wait_for(seen + 1, self._settings.poll_interval)
            units = self._claim(limit)
        return units

    def _claim(self, limit: int) -> list[Unit]:
        if self.batch is not None:
            claimed = self.queues.claim([self.queue], self.batch, together=True)
            units = [claimed] if claimed else []
        else:
            units = [[job] for job in self.queues.claim([self.queue], limit)]
        self._hold(sum(len(unit) for unit in units))
        return units

    def _complete_now(self, done: list[RunningJob]) -> None:
        """Write completions at once, failing as :class:`Completions` does: a write that fails
        for good leaves the jobs to their leases, which run out, and a claim runs them again."""
        try:
            self.queues.complete_many(done)
        except Exception as exc:
            log.warning("completing %d job(s) failed: %s", len(done), first_line(exc))

    def _wake_fleet(self) -> None:
        """Room came back in the queue's limit: every worker's lanes of it claim again now."""
        try:
            self.queues.store.wake_queue(self.queue)
        except Exception as exc:  # the other workers find the room at their next poll
            log.warning("could not wake the lanes of %s: %s", self.queue, first_line(exc))

    def _hold(self, count: int) -> None:
        with self._held_lock:
            self._held += count

    def holds(self, unit: Unit) -> Sequence[Hold]:
        terms: dict[float, Terms] = {}  # by expiry: a batch's jobs share their queue's
        holds = []
        for job in unit:
            expire = job.spec.expire
            if expire not in terms:
                lease = min(self.queues.lease, expire)
                terms[expire] = Terms(lease, self._settings.control_interval, expire)
            holds.append(Hold(Lease(job.job.id, job.lease_owner), terms[expire], job.signal))
        return holds

    def labels(self, unit: Unit) -> Labels:
        first = unit[0].job
        ids = {"job_id": first.id, "queue": self.queue, "attempt": first.attempts}
        if len(unit) > 1:
            ids["batch"] = len(unit)
        return Labels(ids, self.queue)

    def handle(self, unit: Unit, handling: Handling) -> str | None:
        if handling.abort.is_set and handling.abort.reason is AbortReason.SHUTDOWN:
            return "the worker is stopping"
        if self.batch is None:
            return self.queues.run_handler(unit[0])
        return self.queues.run_batch_handler(unit)

    def decide(self, unit: Unit, handled: str | None, handling: Handling) -> Sequence[Outcome]:
        return [self.queues.decide(job, handled) for job in unit]

    def apply(
        self, unit: Unit, handled: str | None, outcomes: Sequence[Outcome], handling: Handling
    ) -> None:
        try:
            done = [j for j, o in zip(unit, outcomes, strict=True) if o.status is COMPLETED]
            if done and self.limited:
                # Its room in the queue's limit comes back at once, not after a shared flush.
                self._complete_now(done)
            elif done:
                self.completions.submit_many(done)
            for job, outcome in zip(unit, outcomes, strict=True):
                if outcome.status is not COMPLETED:
                    self.queues.end(job, outcome, handled)
        finally:
            self.queues.forget(unit)
            self._hold(-len(unit))
            if self.limited:
                self.completions.flushed.emit()  # a claim here waiting for room tries again
                self._wake_fleet()

    def hand_back(self, unit: Unit) -> None:
        self._hold(-len(unit))
        for job in unit:
            try:
                self.queues.hand_back(job)
            except Exception as exc:  # its lease expires and another worker takes it
                log.warning("could not hand back job %s: %s", job.job.id, first_line(exc))

    def stop(self) -> None:
        self.completions.stop()


COMPLETED = JobStatus.COMPLETED


class QueueCron(Service[list[int]]):
    """Fires the application queues' due cron schedules, once per ``queue_schedule_interval``
    on every worker that serves queues (the statement fires each tick once, whoever asks)."""

    name = "queue cron"

    def __init__(self, queues: PostgresQueues, settings: Settings) -> None:
        super().__init__(settings.queue_schedule_interval, settings.max_backoff)
        self._queues = queues

    def _run(self) -> list[int]:
        sent = self._queues.enqueue_due_schedules()
        if sent:
            log.info("cron sent job(s) %s", ", ".join(map(str, sent)))
        return sent


def slots(parts: WorkerParts) -> Sequence[SlotSpec]:
    """A slot per queue ``CONNECTOR_SYNC_LANES`` gives lanes to, and the queues' cron; none for
    a process with no lanes, which serves no queue."""
    queues = parts.queues
    lanes = parse_lanes(parts.settings.lanes)
    if not isinstance(queues, PostgresQueues) or not any(lanes.values()):
        return []
    served = served_queues(lanes, queues.handlers.queues())
    queues.store.set_worker_lanes(parts.worker_id, parts.incarnation, served)
    completions = Completions(queues)
    specs = []
    for name, count in sorted(served.items()):
        spec = queues.get_queue(name)
        limited = spec.global_concurrency is not None
        kind = QueueJobs(queues, name, parts.settings, completions, limited=limited)
        standard = spec.policy is QueuePolicy.STANDARD
        batched = kind.batch is not None
        # A batch waiting for a lane would hold room in a fleet-wide limit: such a queue's
        # claims do not overlap.
        specs.append(
            SlotSpec(
                kind,
                lanes=count,
                claims_ahead=standard and not batched,
                claims_overlap=standard and batched and not limited,
                wakes_on=name,
            )
        )
    if specs:
        specs[0] = replace(specs[0], services=[QueueCron(queues, parts.settings)])
    return specs
