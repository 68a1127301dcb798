"""Lanes: a worker process's threads that run the application queues' jobs, beside its one
connection sync at a time. ``CONNECTOR_SYNC_LANES="knowledge.ingest=4,knowledge.sync=1"`` gives
each queue its lanes; each lane runs one job at a time, so a process runs up to that many jobs
of the queue at once. A process with no lanes serves no queue and claims nothing.

Per queue, one idle lane at a time is the *poller*: on a standard queue it claims a batch, for
every lane not running a handler and as many again to start while its next claim is on the way
(each held by the lease keeper from the claim on); on an exclusive queue one job. It hands the
rest of the batch to the other lanes as they come free, and when nothing is due waits for a
NOTIFY of its queue (the worker's Listener calls :meth:`Lanes.wake`) or the poll interval. On a
queue with a batch handler the poller claims one batch, of the handler's size, for itself and
runs it at once; the next idle lane claims the next batch meanwhile.
Every attempt's lease is held by the worker's one :class:`LeaseKeeper`, on a connection of its
own, so lanes that hold every pooled connection never delay a renewal.

A handler that returned has its job completed by :class:`Completions`, together with the others
that return within a couple of milliseconds, so the lane claims again at once. Schedules of
the application queues are fired here too, once a second, and finished jobs past their
retention pruned once a minute."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from sync.abort import AbortReason
from sync.db import first_line
from sync.errors import InvalidInput
from sync.lease import JOBS, Lease, LeaseKeeper, Terms, Watch
from sync.queues.lanes import parse_lanes, served_queues
from sync.queues.models import QueuePolicy
from sync.queues.port import Queues
from sync.queues.postgres import Attempt, PostgresQueues
from sync.settings import Settings
from sync.signals import TestSignal
from sync.worker_metrics import WorkerMetrics

log = logging.getLogger("sync.lanes")

HANDLERS_GROUP = "connector_sync.handlers"
# Seconds before a lane tries again after a claim or a completion failed (the database is down).
# Not a setting: it only keeps a failing lane from spinning, and a lane's next claim waits for
# the database anyway (the pool's own timeout), so no operator gains by tuning it.
RETRY_AFTER = 0.5
# Seconds a completion waits for others to share its statement and its commit (as
# graphile-worker's completeJobBatchDelay): short jobs return many times within it, and a job's
# lease runs for seconds, so the wait changes nothing else.
COMPLETION_DELAY = 0.002

Setup = Callable[[Queues], object]


def load_setup(reference: str) -> Setup:
    """``module:function`` as the function, or :class:`InvalidInput` in one line."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"--app {reference!r} is not MODULE:FUNCTION, such as myapp.jobs:setup")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"--app {reference!r}: cannot import {module_name} ({exc})") from None
    setup = getattr(module, attr, None)
    if not callable(setup):
        raise InvalidInput(f"--app {reference!r}: {module_name} has no function {attr}")
    return setup


def install_handlers(queues: Queues, apps: Iterable[str] = ()) -> list[str]:
    """Let each application declare its queues and register its handlers on ``queues``: those
    installed under the entry-point group ``connector_sync.handlers`` (each names a
    ``setup(queues)`` function), then each ``module:function`` of ``apps``. The names of the
    applications set up."""
    done: list[str] = []
    for point in sorted(entry_points(group=HANDLERS_GROUP), key=lambda p: p.name):
        point.load()(queues)
        done.append(point.name)
    for reference in apps:
        load_setup(reference)(queues)
        done.append(reference)
    return done


@dataclass(eq=False)
class _Queue:
    """The lanes of one queue and what they share."""

    name: str
    lanes: int
    batch: bool  # standard queues claim for every idle lane at once
    size: int | None = None  # a batch handler's: each lane claims and runs that many at once
    cond: threading.Condition = field(default_factory=threading.Condition)
    claimed: deque[Attempt] = field(default_factory=deque)  # claimed, not started yet
    waiting: int = 0  # idle lanes waiting for the poller
    poller: bool = False  # an idle lane is claiming or waiting for work
    woken: bool = False  # a NOTIFY came while the poller waited
    running: int = 0
    threads: list[threading.Thread] = field(default_factory=list)


class Completions:
    """Completions of attempts whose handlers returned, written together: one thread flushes,
    in one statement, whatever the lanes handed over while its previous flush ran and within
    ``delay`` of the first of them (as graphile-worker batches its completions), so a lane
    goes back to claiming at once and many short jobs share a commit. ``stop()`` writes what
    is pending at once."""

    def __init__(self, queues: PostgresQueues, delay: float = COMPLETION_DELAY) -> None:
        self._queues = queues
        self._delay = delay
        self._cond = threading.Condition()
        self._pending: list[Attempt] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.failures = 0
        self.flushed = TestSignal()  # emitted after each batch of completions is written
        # Emitted when a completion has come and the thread waits for others to join it.
        self.collecting = TestSignal()

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="lanes-completions", daemon=True)
        self._thread.start()

    def submit(self, attempt: Attempt) -> None:
        self.submit_many([attempt])

    def submit_many(self, attempts: list[Attempt]) -> None:
        with self._cond:
            self._pending.extend(attempts)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(30)

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
            for attempt in range(3):
                try:
                    self._queues.complete_many(batch)
                    self.flushes += 1
                    self.flushed.emit()
                    break
                except Exception as exc:  # a lost connection: try again, then leave it
                    self.failures += 1
                    log.warning("completing %d job(s) failed: %s", len(batch), first_line(exc))
                    if attempt == 2:  # their leases run out; a claim runs them again
                        break
                    time.sleep(RETRY_AFTER)


class Lanes:
    """A worker's lanes. ``start()`` them, ``wake(queue)`` on a NOTIFY, ``stop()`` at shutdown
    (running handlers see their abort signal tripped; claimed jobs not started go back)."""

    def __init__(
        self,
        queues: PostgresQueues,
        lanes: dict[str, int],
        keeper: LeaseKeeper,
        settings: Settings,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        served = served_queues(lanes, queues.handlers.queues())
        self.queues = queues
        self._metrics = metrics
        self.settings = settings
        self._keeper = keeper
        self._stopping = threading.Event()
        self._groups: dict[str, _Queue] = {}
        for name, count in sorted(served.items()):
            policy = queues.get_queue(name).policy
            registration = queues.handlers.get(name)
            size = None if registration is None else registration.batch
            self._groups[name] = _Queue(
                name, count, batch=policy is QueuePolicy.STANDARD, size=size
            )
        self._running: dict[int, Attempt] = {}
        self._watches: dict[int, Watch] = {}  # the lease of every attempt claimed here
        self._running_lock = threading.Lock()
        self.completions = Completions(queues)
        self._maintenance: threading.Thread | None = None
        self.attempts_run = 0
        self.claims = 0  # claim round trips
        self._claimed = threading.Condition()
        self.failures = 0  # claims and maintenance rounds that failed

    @classmethod
    def from_settings(
        cls,
        queues: PostgresQueues,
        keeper: LeaseKeeper,
        settings: Settings,
        metrics: WorkerMetrics | None = None,
    ) -> Lanes | None:
        """The lanes ``settings.lanes`` configures, or None when it gives no queue a lane."""
        lanes = parse_lanes(settings.lanes)
        if not any(lanes.values()):
            return None
        return cls(queues, lanes, keeper, settings, metrics)

    @property
    def served(self) -> dict[str, int]:
        return {name: group.lanes for name, group in self._groups.items()}

    def start(self) -> None:
        self._stopping.clear()
        self._keeper.start()
        self.completions.start()
        for group in self._groups.values():
            for number in range(1, group.lanes + 1):
                thread = threading.Thread(
                    target=self._lane,
                    args=(group,),
                    name=f"lane-{group.name}-{number}",
                    daemon=True,
                )
                group.threads.append(thread)
                thread.start()
        self._maintenance = threading.Thread(
            target=self._maintain, name="lanes-maintenance", daemon=True
        )
        self._maintenance.start()
        log.info(
            "lanes started: %s",
            ", ".join(f"{name}={count}" for name, count in self.served.items()),
        )

    def wake(self, queue: str | None = None) -> None:
        """A job of ``queue`` (None: of any queue) may be due: its poller claims now."""
        for group in self._groups.values() if queue is None else [self._groups.get(queue)]:
            if group is None:
                continue
            with group.cond:
                group.woken = True
                group.cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        with self._running_lock:
            running = list(self._running.values())
        for attempt in running:
            attempt.signal.trip(AbortReason.SHUTDOWN)
        for group in self._groups.values():
            with group.cond:
                group.cond.notify_all()
        deadline = time.monotonic() + timeout
        for group in self._groups.values():
            for thread in group.threads:
                thread.join(max(deadline - time.monotonic(), 0.1))
            group.threads.clear()
            while group.claimed:
                self._hand_back(group.claimed.popleft())
        self.completions.stop()
        if self._maintenance is not None:
            self._maintenance.join(5)

    def wait_for_claims(self, count: int, timeout: float = 30.0) -> bool:
        """Block until the lanes have made ``count`` claims (a signal for tests)."""
        with self._claimed:
            return self._claimed.wait_for(lambda: self.claims >= count, timeout)

    # -- a lane ----------------------------------------------------------------------------

    def _lane(self, group: _Queue) -> None:
        while not self._stopping.is_set():
            try:
                attempts = self._next(group)
                if len(attempts) == 1 and group.size is None:
                    self._run(group, attempts[0])
                elif attempts:
                    self._run_batch(group, attempts)
            except Exception:  # a bug must not end the lane quietly: log it and go on
                self.failures += 1
                log.exception("lane of queue %s failed", group.name)
                self._stopping.wait(RETRY_AFTER)

    def _next(self, group: _Queue) -> list[Attempt]:
        """What this lane runs next: an attempt already claimed for it, or, as the queue's
        poller, a fresh claim (all of it on a queue with a batch handler); nothing after
        waiting for a NOTIFY or the poll interval."""
        with group.cond:
            while True:
                if self._stopping.is_set():
                    return []
                if group.claimed:
                    return [group.claimed.popleft()]
                if not group.poller:
                    group.poller = True
                    break
                group.waiting += 1
                group.cond.wait()
                group.waiting -= 1
            # A standard queue claims for every lane not running a handler, and as many again
            # to start while the next claim is on its way, so short jobs never wait for one.
            if group.size is not None:
                limit = group.size
            elif group.batch and group.lanes > 1:
                limit = max(group.lanes - group.running + group.lanes - len(group.claimed), 1)
            else:
                limit = 1
            group.woken = False
        try:
            began = time.monotonic()
            attempts = self.queues.claim([group.name], limit, together=group.size is not None)
            if self._metrics is not None:
                took = time.monotonic() - began
                self._metrics.job_claim_seconds.labels(group.name).observe(took)
            for attempt in attempts:  # held from the claim on, also while they wait a lane
                self._watch(attempt)
            with self._claimed:
                self.claims += 1
                self._claimed.notify_all()
        except Exception as exc:
            self.failures += 1
            log.warning("claim of queue %s failed: %s", group.name, first_line(exc))
            attempts = []
            self._stopping.wait(RETRY_AFTER)
        with group.cond:
            if attempts and group.size is not None:
                group.poller = False
                group.cond.notify()  # the next lane claims the next batch meanwhile
                return attempts
            if attempts:
                group.poller = False
                group.claimed.extend(attempts[1:])
                # As many waiting lanes as there are jobs for them, and one to claim next.
                group.cond.notify(len(attempts))
                return attempts[:1]
            if not group.woken and not self._stopping.is_set():
                group.cond.wait(self.settings.poll_interval)
            group.poller = False
            return []

    def _watch(self, attempt: Attempt) -> None:
        lease = min(self.queues.lease, attempt.spec.expire)
        terms = Terms(lease, self.settings.control_interval, attempt.spec.expire)
        watch = self._keeper.watch(
            Lease(attempt.job.id, attempt.lease_owner), attempt.signal, kind=JOBS, terms=terms
        )
        with self._running_lock:
            self._watches[attempt.job.id] = watch

    def _unwatch(self, attempt: Attempt) -> None:
        with self._running_lock:
            watch = self._watches.pop(attempt.job.id, None)
        if watch is not None:
            self._keeper.release(watch)

    def _run(self, group: _Queue, attempt: Attempt) -> None:
        if self._stopping.is_set() or attempt.signal.is_set:
            self._hand_back(attempt)
            return
        job = attempt.job
        with self._running_lock:
            self._running[job.id] = attempt
        with group.cond:
            group.running += 1
        began = time.monotonic()
        try:
            outcome = self.queues.execute(attempt, complete_later=self.completions.submit)
            self.attempts_run += 1
            if self._metrics is not None:
                ended = outcome.value if outcome is not None else "lost"
                took = time.monotonic() - began
                self._metrics.job_seconds.labels(group.name, ended).observe(took)
        finally:
            self._unwatch(attempt)
            with group.cond:
                group.running -= 1
            with self._running_lock:
                self._running.pop(job.id, None)

    def _run_batch(self, group: _Queue, attempts: list[Attempt]) -> None:
        """Run a batch handler over the batch this lane claimed (see ``_run``)."""
        if self._stopping.is_set() or attempts[0].signal.is_set:
            for attempt in attempts:
                self._hand_back(attempt)
            return
        with self._running_lock:
            for attempt in attempts:
                self._running[attempt.job.id] = attempt
        with group.cond:
            group.running += 1
        began = time.monotonic()
        try:
            outcomes = self.queues.execute_batch(
                attempts, complete_later=self.completions.submit_many
            )
            self.attempts_run += len(attempts)
            if self._metrics is not None:
                took = time.monotonic() - began
                for outcome in outcomes:
                    ended = outcome.value if outcome is not None else "lost"
                    self._metrics.job_seconds.labels(group.name, ended).observe(took)
        finally:
            for attempt in attempts:
                self._unwatch(attempt)
            with group.cond:
                group.running -= 1
            with self._running_lock:
                for attempt in attempts:
                    self._running.pop(attempt.job.id, None)

    def _hand_back(self, attempt: Attempt) -> None:
        self._unwatch(attempt)
        try:
            self.queues.hand_back(attempt)
        except Exception as exc:  # its lease expires and another worker takes it
            log.warning("could not hand back job %s: %s", attempt.job.id, first_line(exc))

    # -- schedules and retention -------------------------------------------------------------

    def _maintain(self) -> None:
        last_prune = time.monotonic()
        while not self._stopping.wait(self.settings.queue_schedule_interval):
            try:
                sent = self.queues.enqueue_due_schedules()
                if sent:
                    log.info("cron sent job(s) %s", ", ".join(map(str, sent)))
                if time.monotonic() - last_prune >= self.settings.queue_prune_interval:
                    last_prune = time.monotonic()
                    self.queues.prune()
            except Exception as exc:
                self.failures += 1
                log.warning("lanes maintenance failed: %s", first_line(exc))
