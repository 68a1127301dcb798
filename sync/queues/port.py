"""The port application modules depend on. A module that only queues work takes a
:class:`JobSender`; code that declares queues, registers handlers or operates them takes
:class:`Queues`; what a worker (or a test) drives to fire schedules and run due jobs is
:class:`JobRunner`. Every implementation (:class:`InMemoryQueues` in ``sync.queues.memory``
serves an application's unit tests) passes the contract suite in ``tests/queues_contract.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Protocol

from sync.queues.declarations import QueueSpec
from sync.queues.models import Job, JobAttempt, JobStatus, QueueStats, Redrive, Schedule


class Abort(Protocol):
    """What a handler listens to: set when its attempt must stop (the job was cancelled, the
    attempt was taken back, the worker is shutting down). A long handler checks it between
    steps, or waits on it instead of sleeping."""

    @property
    def is_set(self) -> bool: ...

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if the signal was set meanwhile."""
        ...

    def report_progress(self, processed: int, total: int | None = None) -> bool:
        """Record how far the attempt got (``Job.processed_units`` and ``total_units``),
        fenced like every write of an attempt: False, and nothing recorded, once the attempt
        no longer holds the job."""
        ...


# A handler runs one attempt of a job; it returns to complete the job and raises to fail the
# attempt. It may run more than once for one job (a retry, an attempt taken back after its
# expiry), so it must be safe to repeat.
Handler = Callable[[Job, Abort], object]
# A batch handler runs one attempt of each job of a batch: up to the size it was registered
# with, all of one queue, claimed together (as pg-boss's ``work()`` with a ``batchSize``). It
# returns to complete every job of the batch in one statement, and raises to fail an attempt of
# each. Its abort is set when any job of the batch is cancelled or taken back, or the worker is
# stopping; a handler that stops early raises, so the jobs it did not finish are retried.
BatchHandler = Callable[[list[Job], Abort], object]
# The most jobs a batch handler may be registered for: one claim, one completion statement.
MAX_BATCH = 1000
# Called once when a job of the queue runs out of attempts, with the dead job: the place to mark
# the item it worked on as failed where a person sees it.
DeadHook = Callable[[Job], object]


class JobSender(Protocol):
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
        """Queue a job and return its id. ``payload`` must be JSON. On an exclusive queue, a job
        whose key (or, without a key, the queue itself) already has a queued, retrying or
        active job is not queued: the id of that job is returned. ``start_after`` delays the
        job by a timedelta or until a (timezone-aware) time. ``priority``: 0 (first) to 9
        (last); the queue's default without one.

        ``conn``: the caller's own connection (a psycopg ``Connection``; for the in-memory
        implementation, one of its transactions): the job is inserted in its open transaction,
        so it exists, and wakes a worker, only once that transaction commits, and never if it
        rolls back. A second sender of a key held by a job not committed yet waits for that
        transaction, then gets its job (or queues its own, if it rolled back)."""
        ...

    def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]:
        """Queue a job per payload (1 to 1000) in one round trip, as :meth:`send` without a
        key; their ids in the order of ``payloads``."""
        ...


class Queues(JobSender, Protocol):
    # Declarations
    def declare_queue(self, spec: QueueSpec) -> QueueSpec:
        """Create the queue, or change it to match ``spec``."""
        ...

    def get_queue(self, name: str) -> QueueSpec: ...

    def list_queues(self) -> list[QueueSpec]: ...

    def delete_queue(self, name: str) -> None:
        """Delete a queue with no pending job, its finished jobs and its schedule."""
        ...

    # Handlers: one per queue, registered by each process at start
    def register(
        self, queue: str, handler: Handler, *, on_dead: DeadHook | None = None
    ) -> None: ...

    def register_batch(
        self,
        queue: str,
        handler: BatchHandler,
        *,
        size: int = 100,
        on_dead: DeadHook | None = None,
    ) -> None:
        """Register a :data:`BatchHandler`: it gets up to ``size`` due jobs of ``queue`` at a
        time (1 to :data:`MAX_BATCH`). ``on_dead`` is called per job, as for :meth:`register`."""
        ...

    # Jobs
    def get_job(self, job_id: int) -> Job: ...

    def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        """The newest jobs first."""
        ...

    def attempts(self, job_id: int) -> list[JobAttempt]:
        """A job's attempts, the first first."""
        ...

    def cancel_job(self, job_id: int) -> Job:
        """Cancel a queued, retrying or active job; an active attempt's abort signal is set."""
        ...

    def retry_job(self, job_id: int) -> Job:
        """A dead or cancelled job back to its queue with a fresh set of attempts, or a
        retrying job due now."""
        ...

    def redrive(self, queue: str) -> Redrive:
        """Every dead job in ``queue`` back to the queue it was sent to, with a fresh set of
        attempts."""
        ...

    # Cron
    def schedule(self, queue: str, cron: str, *, payload: Any = None) -> Schedule:
        """Send ``payload`` to ``queue`` at each tick of ``cron`` (five fields, UTC); replaces
        the queue's schedule if it has one. Scheduling again with the same cron (as a worker's
        setup does at every start) keeps the tick not fired yet, so a tick that came while no
        worker ran still fires; a changed cron starts at its first tick after now."""
        ...

    def unschedule(self, queue: str) -> bool: ...

    def list_schedules(self) -> list[Schedule]: ...

    # What operators watch
    def queue_stats(self) -> list[QueueStats]: ...


class JobRunner(Protocol):
    def enqueue_due_schedules(self) -> list[int]:
        """Fire every schedule whose tick has come; the ids of the jobs this queued."""
        ...

    def run_due(self, *, limit: int = 1000) -> int:
        """Fire due schedules, then claim due jobs of the queues that have a handler and run
        each through it, one after another in the calling thread, until none is due (or
        ``limit`` attempts ran); the number of attempts run. Any number of threads may call it
        at once."""
        ...

    def prune(self) -> int:
        """Delete the jobs that finished longer ago than their queue's retention."""
        ...
