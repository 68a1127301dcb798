"""The in-memory implementation of the queues port, for an application's unit tests: the same
behaviour as the Postgres implementation (one contract suite holds both), no database, time from
an injectable clock, and due jobs run through their handlers synchronously by ``run_due()``::

    clock = ManualClock()
    queues = InMemoryQueues(clock=clock)
    queues.declare_queue(queue_spec("knowledge.ingest"))
    queues.register("knowledge.ingest", ingest)
    my_module.upload(queues, document)  # calls queues.send(...)
    assert queues.run_due() == 1

Thread-safe: any number of threads may send, operate and call ``run_due()`` at once; handlers
and hooks run outside its lock. The state lives in a :class:`JobTable` (``memory_table``), changed
under that lock; here are the decisions and the handlers' runs."""

from __future__ import annotations

import copy
import functools
import logging
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sync.base.clock import Clock, SystemClock
from sync.base.signals import TestSignal
from sync.errors import Conflict, InvalidInput, NotFound
from sync.jobs.outcome import Action
from sync.queues.admission import check_key, due_time
from sync.queues.cron import firing, next_tick, parse_cron
from sync.queues.declarations import QueueSpec
from sync.queues.failures import one_line
from sync.queues.memory_table import WAITING, AttemptAbort, Entry, JobTable
from sync.queues.models import (
    PENDING,
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
from sync.queues.registry import HandlerRegistry, Registration
from sync.queues.retries import DEAD, fate_after
from sync.queues.sending import not_a_connection, outgoing

log = logging.getLogger("sync.queues")

MAX_LIST = 1000


@dataclass(frozen=True)
class _Claim:
    job: Job
    token: int
    abort: AttemptAbort
    registration: Registration


_DeadCall = tuple[DeadHook, Job]


class InMemoryTransaction:
    """A transaction of :class:`InMemoryQueues` (its ``transaction()``), passed as ``conn=``
    where the application passes its own connection to the Postgres implementation. As a
    context manager it commits when the block ends and rolls back when the block raises."""

    def __init__(self, owner: InMemoryQueues) -> None:
        self.owner = owner
        self.closed = False

    def commit(self) -> None:
        self.owner._end(self, commit=True)

    def rollback(self) -> None:
        self.owner._end(self, commit=False)

    def check_open(self) -> None:
        if self.closed:
            raise InvalidInput("the transaction has ended; send in an open one")

    def __enter__(self) -> InMemoryTransaction:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if not self.closed:
            self._end(commit=kind is None)

    def _end(self, *, commit: bool) -> None:
        self.owner._end(self, commit)


class InMemoryQueues(Queues, JobRunner):
    """Time comes from ``clock`` (the system clock by default); retry jitter from ``rand``."""

    def __init__(
        self, *, clock: Clock | None = None, rand: Callable[[], float] = random.random
    ) -> None:
        self._clock = clock or SystemClock()
        self._rand = rand
        self._lock = threading.Lock()
        # Notified when a transaction ends: a sender waiting for a slot it held tries again.
        self._changed = threading.Condition(self._lock)
        self.sender_waits = TestSignal()  # emitted when a send starts waiting for a key
        self._handlers = HandlerRegistry()
        self._table = JobTable()

    # Declarations

    def declare_queue(self, spec: QueueSpec) -> QueueSpec:
        with self._lock:
            if spec.dead_letter is not None and spec.dead_letter not in self._table.queues:
                raise NotFound(
                    f"queue {spec.name!r} names dead-letter queue {spec.dead_letter!r}, which "
                    "does not exist; declare it first"
                )
            existing = self._table.queues.get(spec.name)
            if existing is not None and existing.policy is not spec.policy:
                pending = self._table.pending_in(spec.name)
                if pending:
                    raise Conflict(
                        f"queue {spec.name!r} has {pending} pending job(s); its policy can "
                        "change only while it has none"
                    )
            self._table.queues[spec.name] = spec
            return spec

    def get_queue(self, name: str) -> QueueSpec:
        with self._lock:
            return self._table.spec(name)

    def list_queues(self) -> list[QueueSpec]:
        with self._lock:
            return sorted(self._table.queues.values(), key=lambda spec: spec.name)

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._table.spec(name)
            pending = self._table.pending_in(name)
            if pending:
                raise Conflict(
                    f"queue {name!r} has {pending} queued, retrying or active job(s); cancel "
                    "them or let them finish first"
                )
            users = sorted(s.name for s in self._table.queues.values() if s.dead_letter == name)
            if users:
                raise Conflict(
                    f"queue {name!r} is the dead-letter queue of {', '.join(users)}; give "
                    "them another one first"
                )
            self._table.delete_queue(name)

    # Handlers

    def register(self, queue: str, handler: Handler, *, on_dead: DeadHook | None = None) -> None:
        self._handlers.register(queue, handler, on_dead=on_dead)

    def register_batch(
        self,
        queue: str,
        handler: BatchHandler,
        *,
        size: int = 100,
        on_dead: DeadHook | None = None,
    ) -> None:
        self._handlers.register(queue, handler, on_dead=on_dead, batch=size)

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
        return self._send(queue, [payload], key, start_after, priority, conn)[0]

    def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]:
        return self._send(queue, payloads, None, start_after, priority, conn)

    def transaction(self) -> InMemoryTransaction:
        """A transaction to send in (``conn=``), standing for the application's own: its jobs
        exist once it commits, and never if it rolls back."""
        return InMemoryTransaction(self)

    def _send(
        self,
        queue: str,
        payloads: Iterable[Any],
        key: str | None,
        start_after: datetime | timedelta | None,
        priority: int | None,
        conn: object | None,
    ) -> list[int]:
        if conn is not None and not (isinstance(conn, InMemoryTransaction) and conn.owner is self):
            raise not_a_connection(conn, "a transaction of this InMemoryQueues (.transaction())")
        with self._changed:
            spec = self._table.spec(queue)
            check_key(spec, key)
            sent = outgoing(
                queue, payloads, key=key, start_after=start_after, priority=priority, now=None
            )
            if isinstance(conn, InMemoryTransaction):
                conn.check_open()
            # A slot held by a job another transaction has not committed yet: wait for it.
            while self._table.slot_staged_by(spec, key) not in (None, conn):
                self.sender_waits.emit()
                self._changed.wait()
            now = self._clock.now()
            due = due_time(now, start_after)
            return [
                self._table.insert(
                    spec, value, key, due, now, None, priority=priority, transaction=conn
                )[0]
                for value in sent.payloads
            ]

    def _end(self, transaction: InMemoryTransaction, commit: bool) -> None:
        with self._changed:
            transaction.check_open()
            transaction.closed = True
            if commit:
                self._table.commit(transaction)
            else:
                self._table.rollback(transaction)
            self._changed.notify_all()

    def get_job(self, job_id: int) -> Job:
        with self._lock:
            return self._table.entry(job_id).snapshot()

    def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        if not 1 <= limit <= MAX_LIST:
            raise InvalidInput(f"limit must be from 1 to {MAX_LIST}, not {limit}")
        with self._lock:
            found = [
                entry
                for entry in sorted(self._table.jobs.values(), key=lambda e: -e.id)
                if (queue is None or entry.queue == queue)
                and (status is None or entry.status is status)
            ]
            return [entry.snapshot() for entry in found[:limit]]

    def attempts(self, job_id: int) -> list[JobAttempt]:
        with self._lock:
            return list(self._table.entry(job_id).history)

    def cancel_job(self, job_id: int) -> Job:
        with self._lock:
            entry = self._table.entry(job_id)
            if entry.status not in PENDING:
                raise Conflict(
                    f"job {job_id} is {entry.status}; only queued, retrying or active jobs can "
                    "be cancelled"
                )
            self._table.cancel(entry, self._clock.now())
            return entry.snapshot()

    def retry_job(self, job_id: int) -> Job:
        with self._lock:
            entry = self._table.entry(job_id)
            now = self._clock.now()
            if entry.status is JobStatus.RETRYING:
                entry.run_after = now
            elif entry.status in (JobStatus.DEAD, JobStatus.CANCELLED):
                self._table.requeue(entry, now)
            else:
                raise Conflict(
                    f"job {job_id} is {entry.status}; only dead, cancelled or retrying jobs can "
                    "be retried (send a new job instead)"
                )
            return entry.snapshot()

    def redrive(self, queue: str) -> Redrive:
        with self._lock:
            self._table.spec(queue)
            now = self._clock.now()
            redriven: list[int] = []
            skipped: list[int] = []
            for entry in sorted(self._table.jobs.values(), key=lambda e: e.id):
                if entry.queue != queue or entry.status is not JobStatus.DEAD:
                    continue
                try:
                    self._table.requeue(entry, now)
                except (Conflict, NotFound):
                    skipped.append(entry.id)
                else:
                    redriven.append(entry.id)
            return Redrive(tuple(redriven), tuple(skipped))

    # Cron

    def schedule(self, queue: str, cron: str, *, payload: Any = None) -> Schedule:
        expression = parse_cron(cron)
        with self._lock:
            self._table.spec(queue)
            value = json_payload(queue, payload)
            existing = self._table.schedules.get(queue)
            if existing is not None and existing.cron == expression:
                pending = existing.next_tick  # the same cron keeps its tick not fired yet
            else:
                pending = next_tick(expression, self._clock.now())
            made = Schedule(
                queue=queue,
                cron=expression,
                payload=value,
                next_tick=pending,
                last_tick=existing.last_tick if existing else None,
            )
            self._table.schedules[queue] = made
            return replace(made, payload=copy.deepcopy(value))

    def unschedule(self, queue: str) -> bool:
        with self._lock:
            return self._table.schedules.pop(queue, None) is not None

    def list_schedules(self) -> list[Schedule]:
        with self._lock:
            return [
                replace(s, payload=copy.deepcopy(s.payload))
                for s in sorted(self._table.schedules.values(), key=lambda s: s.queue)
            ]

    def enqueue_due_schedules(self) -> list[int]:
        sent: list[int] = []
        with self._lock:
            now = self._clock.now()
            for name, schedule in list(self._table.schedules.items()):
                fire = firing(schedule.cron, schedule.next_tick, now)
                if fire.tick is None:
                    continue
                job_id, created = self._table.insert(
                    self._table.queues[name],
                    copy.deepcopy(schedule.payload),
                    None,
                    now,
                    now,
                    fire.tick,
                )
                if created:
                    sent.append(job_id)
                self._table.schedules[name] = replace(
                    schedule, next_tick=fire.next_tick, last_tick=fire.tick
                )
        return sent

    # What operators watch

    def queue_stats(self) -> list[QueueStats]:
        with self._lock:
            now = self._clock.now()
            stats = []
            for spec in sorted(self._table.queues.values(), key=lambda s: s.name):
                inside = [e for e in self._table.jobs.values() if e.queue == spec.name]
                count = {status: 0 for status in JobStatus}
                for entry in inside:
                    count[entry.status] += 1
                due = [e.run_after for e in inside if e.status in WAITING and e.run_after <= now]
                stats.append(
                    QueueStats(
                        name=spec.name,
                        policy=spec.policy,
                        queued=count[JobStatus.QUEUED],
                        active=count[JobStatus.ACTIVE],
                        retrying=count[JobStatus.RETRYING],
                        dead=count[JobStatus.DEAD],
                        oldest_due_at=min(due, default=None),
                    )
                )
            return stats

    # Running due jobs

    def run_due(self, *, limit: int = 1000) -> int:
        self.enqueue_due_schedules()
        ran = 0
        while ran < limit:
            with self._lock:
                claim, dead = self._claim(self._clock.now())
                batch = self._batch_of(claim, limit - ran, dead)
            self._call_hooks(dead)
            if claim is None:
                break
            if claim.registration.batch is None:
                error = self._run(claim)
                self._call_hooks(self._finish(claim, error))
                ran += 1
                continue
            error = self._run_batch(batch)
            for member in batch:
                self._call_hooks(self._finish(member, error))
            ran += len(batch)
        return ran

    def _batch_of(self, claim: _Claim | None, room: int, dead: list[_DeadCall]) -> list[_Claim]:
        """For a claim of a batch handler's queue, the batch it heads: more due jobs of that
        queue, up to the handler's size (or ``room``), sharing its abort signal. Under the
        lock."""
        if claim is None or claim.registration.batch is None:
            return [] if claim is None else [claim]
        batch = [claim]
        now = self._clock.now()
        while len(batch) < min(claim.registration.batch, room):
            more, gone = self._claim(now, only=claim.job.origin_queue, abort=claim.abort)
            dead.extend(gone)
            if more is None:
                break
            batch.append(more)
        held = [(member.job.id, member.token) for member in batch]
        claim.abort.report_to(functools.partial(self._report_all, held))
        return batch

    def prune(self) -> int:
        with self._lock:
            return self._table.prune(self._clock.now())

    # Internals; the names ending without a lock take it themselves, the others expect it held.

    def _claim(
        self, now: datetime, *, only: str | None = None, abort: AttemptAbort | None = None
    ) -> tuple[_Claim | None, list[_DeadCall]]:
        """Start an attempt of the due job that has waited longest, in a queue with a handler
        (``only`` that queue, when given). An active attempt past its expiry is taken back on
        the way: retried by this claim, or dead-lettered when its attempts are spent.
        ``abort``: the signal the attempt shares with its batch."""
        served = self._handlers.queues() if only is None else {only}
        dead: list[_DeadCall] = []
        while True:
            entry = self._table.next_due(served, now)
            if entry is None:
                return None, dead
            spec = self._table.queues[entry.origin_queue]
            if entry.status is JobStatus.ACTIVE:
                error = f"the attempt outlived the queue's expiry of {spec.expire:g} s"
                self._table.close_attempt(entry, now, AttemptOutcome.EXPIRED, error)
                decision = fate_after(
                    AttemptOutcome.EXPIRED, attempts=entry.attempts, queue=spec, rand=self._rand
                )
                if decision == DEAD:
                    dead.extend(self._bury(entry, spec, now))
                    continue
            registration = self._handlers.get(entry.origin_queue)
            assert registration is not None
            token = self._table.new_token()
            if abort is None:
                abort = AttemptAbort(functools.partial(self._report, entry.id, token))
            self._table.start(entry, token, abort, now)
            return _Claim(entry.snapshot(), token, abort, registration), dead

    def _report(self, job_id: int, token: int, processed: int, total: int | None) -> bool:
        """A handler's progress, fenced by its attempt's token like the attempt's end."""
        with self._lock:
            return self._table.record_progress(job_id, token, processed, total, self._clock.now())

    def _report_all(self, held: list[tuple[int, int]], processed: int, total: int | None) -> bool:
        """A batch handler's progress, on every job of its batch; True when each recorded it."""
        recorded = [self._report(job_id, token, processed, total) for job_id, token in held]
        return all(recorded)

    def _run(self, claim: _Claim) -> str | None:
        """Run the handler; the failure as one line, or None when it returned."""
        try:
            claim.registration.handler(claim.job, claim.abort)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "job %s of queue %s failed attempt %s: %s",
                claim.job.id,
                claim.job.queue,
                claim.job.attempts,
                error,
            )
            return error
        return None

    def _run_batch(self, batch: list[_Claim]) -> str | None:
        """Run a batch handler once over the batch; the failure as one line, or None."""
        head = batch[0]
        try:
            head.registration.handler([c.job for c in batch], head.abort)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "a batch of %d job(s) of queue %s failed: %s", len(batch), head.job.queue, error
            )
            return error
        return None

    def _finish(self, claim: _Claim, error: str | None) -> list[_DeadCall]:
        """Apply the attempt's end, fenced by its token: an attempt that was cancelled, taken
        back, or that outlived its expiry (a claim will take it back) changes nothing."""
        with self._lock:
            now = self._clock.now()
            entry = self._table.jobs.get(claim.job.id)
            if not self._table.holds(entry, claim.token, now):
                log.info(
                    "job %s: attempt %s ended after it lost the job",
                    claim.job.id,
                    claim.job.attempts,
                )
                return []
            assert entry is not None
            spec = self._table.queues[entry.origin_queue]
            outcome = AttemptOutcome.COMPLETED if error is None else AttemptOutcome.FAILED
            self._table.close_attempt(entry, now, outcome, error)
            decision = fate_after(outcome, attempts=entry.attempts, queue=spec, rand=self._rand)
            if decision.action is Action.REQUEUE:
                self._table.retry(entry, now + timedelta(seconds=decision.delay or 0.0))
                return []
            if decision.status is JobStatus.COMPLETED:
                self._table.complete(entry, now)
                return []
            return self._bury(entry, spec, now)

    def _bury(self, entry: Entry, spec: QueueSpec, now: datetime) -> list[_DeadCall]:
        """Dead-letter a job whose attempts are spent; the on_dead hook to call, if any."""
        self._table.bury(entry, spec, now)
        registration = self._handlers.get(entry.origin_queue)
        if registration is None or registration.on_dead is None:
            return []
        return [(registration.on_dead, entry.snapshot())]

    def _call_hooks(self, calls: list[_DeadCall]) -> None:
        for hook, job in calls:
            try:
                hook(job)
            except Exception as exc:
                log.error(
                    "the on_dead hook of queue %s failed for job %s: %s",
                    job.origin_queue,
                    job.id,
                    one_line(exc),
                )
