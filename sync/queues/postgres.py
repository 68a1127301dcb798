"""The Postgres implementation of the queues port, over the tables of migration 0010 and the
statements of ``sql/queues.sql`` (through :class:`sync.queues.store.JobStore`). It passes the
same contract suite as :class:`sync.queues.memory.InMemoryQueues`.

Time: with a ``clock`` (tests pass a :class:`ManualClock`) every statement is given that clock's
now, as River's driver takes ``now``; without one, every statement uses the database's own
``now()``, so workers on machines whose clocks disagree still agree on when a job is due.

A worker's lanes (``sync.worker.slots``) use :meth:`claim` and :meth:`execute`; tests and
single-threaded tools use :meth:`run_due`."""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from sync.base.abort import AbortReason, AbortSignal
from sync.base.clock import Clock
from sync.errors import Conflict, NotFound
from sync.jobs.outcome import Action, Outcome
from sync.queues.caller import send_on
from sync.queues.cron import firing, next_tick, parse_cron
from sync.queues.declarations import QueueSpec
from sync.queues.failures import one_line
from sync.queues.models import (
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    QueueStats,
    Redrive,
    Schedule,
)
from sync.queues.payloads import json_payload
from sync.queues.port import BatchHandler, DeadHook, Handler, JobRunner, Queues
from sync.queues.refusals import (
    cannot_cancel,
    cannot_retry,
    check_list_limit,
    no_job,
    no_such_queue,
    queue_gone,
    slot_taken,
)
from sync.queues.registry import HandlerRegistry, Registration
from sync.queues.retries import fate_after
from sync.queues.running import AttemptHandle, RunningJob
from sync.queues.sending import Outgoing, no_queue, not_a_connection, outgoing, sent_ids
from sync.queues.store import JobStore, QueueChanges
from sync.store.db import Pool

log = logging.getLogger("sync.queues")

PRUNE_BATCH = 5000
DEFAULT_LEASE = 120.0


class PostgresQueues(Queues, JobRunner):
    """``pool``: the engine's pool (autocommit connections, dict rows, the schema on the
    search path). ``lease``: the seconds a claim holds an attempt before it must be renewed
    (never more than the queue's expire)."""

    def __init__(
        self,
        pool: Pool,
        *,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        lease: float = DEFAULT_LEASE,
        schema: str | None = None,
    ) -> None:
        self.store = JobStore(pool)
        self._schema = schema
        self._clock = clock
        self._rand = rand
        self.lease = lease
        self.handlers = HandlerRegistry()
        # The attempts running in this process, by job: a cancel or a claim taking a job back
        # here trips the stale attempt's signal at once (other processes learn it from their
        # lease keeper's control read).
        self._local: dict[int, tuple[UUID, AbortSignal]] = {}
        self._local_lock = threading.Lock()

    def _now(self) -> datetime | None:
        return None if self._clock is None else self._clock.now()

    def _moment(self) -> datetime:
        return self._clock.now() if self._clock is not None else self.store.database_now()

    # Declarations

    def declare_queue(self, spec: QueueSpec) -> QueueSpec:
        def declare(queues: QueueChanges) -> QueueSpec:
            if spec.dead_letter is not None and queues.get_queue(spec.dead_letter) is None:
                raise NotFound(
                    f"queue {spec.name!r} names dead-letter queue {spec.dead_letter!r}, which "
                    "does not exist; declare it first"
                )
            existing = queues.lock_queue(spec.name)
            if existing is not None and existing.policy is not spec.policy:
                pending = queues.count_pending(spec.name)
                if pending:
                    raise Conflict(
                        f"queue {spec.name!r} has {pending} pending job(s); its policy can "
                        "change only while it has none"
                    )
            return queues.upsert_queue(spec)

        return self.store.changing_queues(declare)

    def get_queue(self, name: str) -> QueueSpec:
        spec = self.store.get_queue(name)
        if spec is None:
            raise no_such_queue(name)
        return spec

    def list_queues(self) -> list[QueueSpec]:
        return self.store.list_queues()

    def delete_queue(self, name: str) -> None:
        def delete(queues: QueueChanges) -> None:
            if queues.lock_queue(name) is None:
                raise NotFound(f"no queue named {name!r}; declare it first")
            pending = queues.count_pending(name)
            if pending:
                raise Conflict(
                    f"queue {name!r} has {pending} queued, retrying or active job(s); cancel "
                    "them or let them finish first"
                )
            users = queues.dead_letter_users(name)
            if users:
                raise Conflict(
                    f"queue {name!r} is the dead-letter queue of {', '.join(users)}; give "
                    "them another one first"
                )
            queues.delete_queue(name)

        self.store.changing_queues(delete)

    # Handlers

    def register(self, queue: str, handler: Handler, *, on_dead: DeadHook | None = None) -> None:
        self.handlers.register(queue, handler, on_dead=on_dead)

    def register_batch(
        self,
        queue: str,
        handler: BatchHandler,
        *,
        size: int = 100,
        on_dead: DeadHook | None = None,
    ) -> None:
        self.handlers.register(queue, handler, on_dead=on_dead, batch=size)

    # Jobs

    def send(
        self,
        queue: str,
        payload: Any,
        *,
        key: str | None = None,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> int:
        now = self._now()
        sent = outgoing(
            queue, [payload], key=key, start_after=start_after, priority=priority, now=now
        )
        return self._send(sent, now, conn)[0]

    def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]:
        now = self._now()
        sent = outgoing(
            queue, payloads, key=None, start_after=start_after, priority=priority, now=now
        )
        return self._send(sent, now, conn)

    def _send(self, sent: Outgoing, now: datetime | None, conn: object | None) -> list[int]:
        if conn is not None and not isinstance(conn, psycopg.Connection):
            raise not_a_connection(conn, "a psycopg Connection")
        try:
            if conn is None:
                results = self.store.send(sent, now)
            else:
                results = send_on(conn, self.schema, sent, now)
        except psycopg.errors.ForeignKeyViolation:  # the queue was deleted meanwhile
            raise no_queue(sent.queue) from None
        return sent_ids(sent.queue, results)

    @property
    def schema(self) -> str:
        """The schema of the queues' tables, named by the statements run on a caller's
        connection."""
        if self._schema is None:
            self._schema = self.store.current_schema()
        return self._schema

    def get_job(self, job_id: int) -> Job:
        job = self.store.get_job(job_id)
        if job is None:
            raise no_job(job_id)
        return job

    def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        check_list_limit(limit)
        return self.store.list_jobs(queue, status, limit)

    def attempts(self, job_id: int) -> list[JobAttempt]:
        found = self.store.attempts(job_id)
        if not found:
            self.get_job(job_id)
        return found

    def cancel_job(self, job_id: int) -> Job:
        cancelled = self.store.cancel(job_id, self._now())
        if cancelled.previous is None:
            raise no_job(job_id)
        if cancelled.job is None:
            raise cannot_cancel(job_id, cancelled.previous)
        if cancelled.lease_owner is not None:
            self.cancelled_here(job_id, cancelled.lease_owner)
        return cancelled.job

    def cancelled_here(self, job_id: int, owner: UUID) -> None:
        """A job was cancelled while its attempt ``owner`` ran: if it runs in this process,
        its abort signal is set now (elsewhere, its lease keeper's control read tells it)."""
        self._trip_local(job_id, owner, AbortReason.CANCELLED)

    def retry_job(self, job_id: int) -> Job:
        job = self.get_job(job_id)
        now = self._now()
        if job.status is JobStatus.RETRYING:
            due = self.store.make_retrying_due(job_id, now)
            if due is not None:
                return due
            job = self.get_job(job_id)  # it was claimed meanwhile
        if job.status in (JobStatus.DEAD, JobStatus.CANCELLED):
            return self._requeue(job, now)
        raise cannot_retry(job_id, job.status)

    def _requeue(self, job: Job, now: datetime | None) -> Job:
        try:
            requeued = self.store.requeue(job.id, now)
        except psycopg.errors.UniqueViolation:
            holder = self.store.slot_holder(job.origin_queue, job.key)
            raise slot_taken(job, holder) from None
        if requeued is not None:
            return requeued
        if self.store.get_queue(job.origin_queue) is None:
            raise queue_gone(job)
        raise cannot_retry(job.id, self.get_job(job.id).status)

    def redrive(self, queue: str) -> Redrive:
        self.get_queue(queue)
        now = self._now()
        redriven: list[int] = []
        skipped: list[int] = []
        for job_id in self.store.dead_jobs(queue):
            job = self.store.get_job(job_id)
            if job is None or job.status is not JobStatus.DEAD:
                continue
            try:
                self._requeue(job, now)
            except (Conflict, NotFound):
                skipped.append(job_id)
            else:
                redriven.append(job_id)
        return Redrive(tuple(redriven), tuple(skipped))

    # Cron

    def schedule(self, queue: str, cron: str, *, payload: Any = None) -> Schedule:
        expression = parse_cron(cron)
        self.get_queue(queue)
        value = json_payload(queue, payload)
        try:
            return self.store.upsert_schedule(
                queue, expression, value, next_tick(expression, self._moment())
            )
        except psycopg.errors.ForeignKeyViolation:
            raise NotFound(f"no queue named {queue!r}; declare it first") from None

    def unschedule(self, queue: str) -> bool:
        return self.store.delete_schedule(queue)

    def list_schedules(self) -> list[Schedule]:
        return self.store.list_schedules()

    def enqueue_due_schedules(self) -> list[int]:
        now = self._moment()
        sent: list[int] = []
        for queue, cron, pending in self.store.due_schedules(now):
            fire = firing(cron, pending, now)
            if fire.tick is None:
                continue
            job_id = self.store.fire_schedule(queue, pending, fire.tick, fire.next_tick, now)
            if job_id is not None:
                sent.append(job_id)
        return sent

    # What operators watch

    def queue_stats(self) -> list[QueueStats]:
        return self.store.queue_stats(self._now())

    # Running jobs

    def claim(self, queues: list[str], limit: int, *, together: bool = False) -> list[RunningJob]:
        """Start up to ``limit`` attempts of due jobs of ``queues`` (each must have a handler
        here). Jobs the claim dead-lettered (an expired attempt with none left) have their
        on_dead hook called here, once. ``together``: the attempts of one batch, for
        :meth:`execute_batch`, share one abort signal."""
        return self._claim(queues, limit, together=together)[0]

    def _claim(
        self, queues: list[str], limit: int, *, together: bool = False
    ) -> tuple[list[RunningJob], int]:
        """The attempts started, and how many jobs the claim took (dead-lettered ones too)."""
        attempts: list[RunningJob] = []
        shared = AbortSignal() if together else None
        claimed_rows = self.store.claim(queues, limit, self.lease, self._now())
        for claimed in claimed_rows:
            registration = self.handlers.get(claimed.job.origin_queue)
            if claimed.job.status is JobStatus.DEAD:
                self._stale_attempt_ends(claimed.job.id)
                self._call_hook(registration, claimed.job)
                continue
            assert registration is not None, "claimed a job of a queue without a handler"
            signal = shared or AbortSignal()
            job, owner = claimed.job, claimed.lease_owner
            attempts.append(RunningJob(job, owner, claimed.spec, registration, signal))
        self._started(attempts)
        return attempts, len(claimed_rows)

    def _started(self, attempts: list[RunningJob]) -> None:
        """Attempts a claim started in this process, from now on tripped by a claim that takes
        their jobs back; an attempt this process ran of the same job is stale, and trips now."""
        with self._local_lock:
            stale = [self._local.get(attempt.job.id) for attempt in attempts]
            for attempt in attempts:
                self._local[attempt.job.id] = (attempt.lease_owner, attempt.signal)
        for held in stale:
            if held is not None:
                held[1].trip(AbortReason.LEASE_LOST)

    def execute(
        self, attempt: RunningJob, *, complete_later: Callable[[RunningJob], object] | None = None
    ) -> AttemptOutcome | None:
        """Run the attempt's handler and apply its end, fenced by the attempt's token; the
        outcome, or None when the attempt had lost the job by then (cancelled, taken back or
        past its expiry) and its end changed nothing. With ``complete_later``, a handler that
        returned is handed to it (which calls :meth:`complete_many` soon, with others)."""
        try:
            error = self.run_handler(attempt)
            if error is None and complete_later is not None:
                complete_later(attempt)
                return AttemptOutcome.COMPLETED
            return self.end(attempt, self.decide(attempt, error), error)
        finally:
            self.forget([attempt])

    def execute_batch(self, attempts: list[RunningJob]) -> list[AttemptOutcome | None]:
        """Run a batch handler once over the attempts of one :meth:`claim` with ``together``
        (all of one queue), then apply their ends: every job completed in one statement when
        it returned, an attempt of each failed when it raised. The outcome of each attempt, as
        :meth:`execute` gives it."""
        if not attempts:
            return []
        try:
            error = self.run_batch_handler(attempts)
            if error is None:
                done = self.complete_many(attempts)
                return [AttemptOutcome.COMPLETED if a.job.id in done else None for a in attempts]
            return [self.end(a, self.decide(a, error), error) for a in attempts]
        finally:
            self.forget(attempts)

    # The parts of an attempt, as the worker's application-job kind runs them.

    def run_handler(self, attempt: RunningJob) -> str | None:
        """Call the attempt's handler; what it raised, in one line, or None."""
        job = attempt.job
        handle = AttemptHandle(
            attempt.signal,
            lambda done, total: self.store.report_progress(
                job.id, attempt.lease_owner, done, total, self._now()
            ),
        )
        try:
            attempt.registration.handler(job, handle)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "job %s of queue %s failed attempt %s: %s",
                job.id,
                job.origin_queue,
                job.attempts,
                error,
            )
            return error
        return None

    def run_batch_handler(self, attempts: list[RunningJob]) -> str | None:
        """Call a batch handler once over the attempts of one batch; what it raised, or None."""
        registration = attempts[0].registration
        handle = AttemptHandle(attempts[0].signal, functools.partial(self._report_all, attempts))
        try:
            registration.handler([a.job for a in attempts], handle)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "a batch of %d job(s) of queue %s failed: %s",
                len(attempts),
                registration.queue,
                error,
            )
            return error
        return None

    def decide(self, attempt: RunningJob, error: str | None) -> Outcome:
        """What becomes of an attempt's job (pure but for the queue's random jitter): a handler
        that stopped because the worker is stopping hands its job back, not its failure."""
        if error is not None and attempt.signal.reason is AbortReason.SHUTDOWN:
            return Outcome(Action.HAND_BACK)
        outcome = AttemptOutcome.COMPLETED if error is None else AttemptOutcome.FAILED
        return fate_after(
            outcome, attempts=attempt.job.attempts, queue=attempt.spec, rand=self._rand
        )

    def end(
        self, attempt: RunningJob, decided: Outcome, error: str | None
    ) -> AttemptOutcome | None:
        """Apply a decision about an attempt's job, fenced by the attempt's token: how the
        attempt ended, or None when it had lost the job first (or was handed back)."""
        job, owner, now = attempt.job, attempt.lease_owner, self._now()
        if decided.action is Action.HAND_BACK:
            if self.store.hand_back(job.id, owner, now):
                log.info("job %s handed back at shutdown", job.id)
            return None
        if decided.action is Action.REQUEUE:
            assert error is not None
            applied = self.store.retry(job.id, owner, error, decided.delay or 0.0, now)
        elif decided.status == JobStatus.COMPLETED:
            applied = self.store.complete(job.id, owner, now)
        else:
            assert error is not None
            dead = self.store.bury(job.id, owner, error, now)
            applied = dead is not None
            if dead is not None:
                self._call_hook(attempt.registration, dead)
        if not applied:
            log.info("job %s: attempt %s ended after it lost the job", job.id, job.attempts)
            return None
        return AttemptOutcome.COMPLETED if error is None else AttemptOutcome.FAILED

    def forget(self, attempts: list[RunningJob]) -> None:
        """The attempts ended here: a claim taking their jobs back has nothing to stop."""
        with self._local_lock:
            for attempt in attempts:
                if self._local.get(attempt.job.id, (None,))[0] == attempt.lease_owner:
                    del self._local[attempt.job.id]

    def _report_all(self, attempts: list[RunningJob], processed: int, total: int | None) -> bool:
        """A batch handler's progress, recorded on every job of its batch, each fenced by its
        attempt; True when every one was recorded."""
        now = self._now()
        recorded = [
            self.store.report_progress(a.job.id, a.lease_owner, processed, total, now)
            for a in attempts
        ]
        return all(recorded)

    def complete_many(self, attempts: list[RunningJob]) -> set[int]:
        """Complete attempts whose handlers returned, in one statement, each fenced by its
        token; the ids of the jobs completed (the others had lost their job)."""
        done = self.store.complete_many([(a.job.id, a.lease_owner) for a in attempts], self._now())
        for attempt in attempts:
            if attempt.job.id not in done:
                log.info(
                    "job %s: attempt %s ended after it lost the job",
                    attempt.job.id,
                    attempt.job.attempts,
                )
        return done

    def hand_back(self, attempt: RunningJob) -> bool:
        """An attempt claimed but not run back to its queue, as the worker closes, without
        spending an attempt; False if it had lost the job already."""
        self.forget([attempt])
        job, owner = attempt.job, attempt.lease_owner
        return self.store.hand_back(job.id, owner, self._now(), closing=True)

    def run_due(self, *, limit: int = 1000) -> int:
        self.enqueue_due_schedules()
        singles: list[Registration] = []
        batches: list[Registration] = []
        for queue in sorted(self.handlers.queues()):
            registration = self.handlers.get(queue)
            assert registration is not None
            (singles if registration.batch is None else batches).append(registration)
        ran = 0
        while ran < limit:
            taken = 0
            if singles:
                attempts, taken = self._claim([r.queue for r in singles], 1)
                for attempt in attempts:
                    self.execute(attempt)
                    ran += 1
            for registration in batches:
                if taken or ran >= limit:
                    break
                assert registration.batch is not None
                size = min(registration.batch, limit - ran)
                attempts, taken = self._claim([registration.queue], size, together=True)
                self.execute_batch(attempts)
                ran += len(attempts)
            if not taken:
                break
        return ran

    def prune(self) -> int:
        gone = 0
        while True:
            batch = self.store.prune(self._now(), PRUNE_BATCH)
            gone += batch
            if batch < PRUNE_BATCH:
                return gone

    # Internals

    def _trip_local(self, job_id: int, owner: UUID, reason: AbortReason) -> None:
        with self._local_lock:
            held = self._local.get(job_id)
        if held is not None and held[0] == owner:
            held[1].trip(reason)

    def _stale_attempt_ends(self, job_id: int) -> None:
        with self._local_lock:
            held = self._local.pop(job_id, None)
        if held is not None:
            held[1].trip(AbortReason.LEASE_LOST)

    def _call_hook(self, registration: Registration | None, job: Job) -> None:
        if registration is None or registration.on_dead is None:
            return
        try:
            registration.on_dead(job)
        except Exception as exc:
            log.error(
                "the on_dead hook of queue %s failed for job %s: %s",
                job.origin_queue,
                job.id,
                one_line(exc),
            )
