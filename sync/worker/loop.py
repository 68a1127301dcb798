"""The worker process: one run at a time, awaited inline; scale by running more processes.

``Worker.poll()`` runs a fixed list of stages once (heartbeat, due schedules, claim and execute
at most one run, sweep of seen keys, retention), each wrapped so one failing stage never skips the
others. ``run()`` loops ``poll(); wait(poll_interval)``, woken early by LISTEN/NOTIFY, and runs
each service (``sync.worker.services``) on a timer thread of its own meanwhile, so a run that
executes for hours starves none of them; ``poll()`` then leaves them to their timers. Tests call
``poll()``, with no timers.

A worker registers when it is created: its own incarnation of its id (process, host, version,
start time) and the providers whose connectors it has loaded. It claims only syncs of those
providers; a second live worker with the same id is refused.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from types import FrameType
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily
from psycopg_pool import PoolTimeout

import connectors
from sync.base.abort import AbortReason
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.base.signals import TestSignal
from sync.errors import Conflict
from sync.ingestions.stage import IngestionStage
from sync.jobs.executor import Executor
from sync.jobs.lease import LeaseKeeper
from sync.jobs.metrics import WorkerMetrics, counter_family
from sync.queues.postgres import PostgresQueues
from sync.store import ClaimedRun, ClaimTerms, RetryPolicy, RunStore, Seal, WorkerRow
from sync.store.db import Pool, connect_listener, first_line, listen_url
from sync.store.migrations import check_schema
from sync.worker.services import Cleaner, Heartbeat, ScheduleEnqueuer, SeenKeySweeper, Service
from sync.worker.slots import Lanes

log = logging.getLogger("sync.worker")

# The kinds of leased work a worker runs, exported as zeros before their first lease is lost.
LEASE_KINDS = ("run", "job", "ingestion")

# Worker ids registered by the Worker objects of this process that are still open: a previous
# incarnation recorded with this process's own pid is one of them, or a dead process whose pid
# this one reuses (a restarted container).
_open_here: set[str] = set()
_open_here_lock = threading.Lock()


@functools.cache
def _version() -> str:
    try:
        return version("connector-sync")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


class Listener:
    """Holds a LISTEN connection and sets ``wake`` on every notification of a run; one of an
    application job (``job:<queue>``) wakes only that queue's lanes (``on_job``). Reconnects
    with backoff when the connection drops, and wakes the worker and every lane after
    reconnecting, since notifications sent meanwhile are lost."""

    def __init__(
        self,
        settings: Settings,
        url: str,
        wake: threading.Event,
        on_job: Callable[[str | None], object] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self._settings = settings
        self._worker_id = worker_id  # also listens on this worker's own channel
        self._url = url
        self._wake = wake
        self._on_job = on_job
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # A second handle on the LISTEN session's socket, for stop() to shut it down with.
        self._socket: socket.socket | None = None
        self.connected = threading.Event()
        self.failures = 0
        self.lost = TestSignal()  # emitted each time the connection is lost

    def start(self) -> None:
        if self.alive:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        # The session waits for a notification with no statement running, so a cancel request
        # would not end the wait (only the next liveness check would, seconds later): shutting
        # its socket down ends it at once. The handle is a duplicate the loop owns, so its
        # number can never name another connection's socket meanwhile.
        handle = self._socket
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                with connect_listener(self._settings, self._url) as conn:
                    self._socket = socket.socket(fileno=os.dup(conn.pgconn.socket))
                    if self._stopping.is_set():
                        return
                    # The listener's own statements stay here rather than in a store: they run
                    # on this dedicated session (not the pool's, and past any transaction
                    # pooler), which has no search_path of the engine's, so the names are
                    # schema-qualified with psycopg.sql, and LISTEN takes its channel as an
                    # identifier, never a parameter. Neither fits a named statement.
                    channel = conn.execute(
                        psycopg.sql.SQL("SELECT {}.notify_channel() AS c").format(
                            psycopg.sql.Identifier(self._settings.schema_name)
                        )
                    ).fetchone()
                    assert channel is not None
                    conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel["c"]))
                    )
                    if self._worker_id is not None:
                        own = conn.execute(
                            psycopg.sql.SQL("SELECT {}.worker_channel_v3(%s) AS c").format(
                                psycopg.sql.Identifier(self._settings.schema_name)
                            ),
                            (self._worker_id,),
                        ).fetchone()
                        assert own is not None
                        conn.execute(
                            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(own["c"]))
                        )
                    self.connected.set()
                    self._wake.set()
                    if self._on_job is not None:
                        self._on_job(None)
                    delay = 0.5
                    while not self._stopping.is_set():
                        # The timeout doubles as a liveness check of a half-open connection.
                        timeout = self._settings.listen_check_interval
                        for note in conn.notifies(timeout=timeout, stop_after=1):
                            if not note.payload.startswith("job:"):
                                self._wake.set()
                            elif self._on_job is not None:
                                self._on_job(note.payload[4:])
                        conn.execute("SELECT 1")
            except Exception as exc:
                self.connected.clear()
                if self._stopping.is_set():
                    return
                self.failures += 1
                self.lost.emit()
                log.warning(
                    "LISTEN connection lost (%s); reconnecting in %.1f s", first_line(exc), delay
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, self._settings.max_backoff)
            finally:
                handle, self._socket = self._socket, None
                if handle is not None:
                    handle.close()


class Worker:
    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        url: str,
        *,
        secrets: SecretBox | None = None,
        worker_id: str | None = None,
        listen: bool = True,
        providers: Sequence[str] | None = None,
        queues: PostgresQueues | None = None,
    ) -> None:
        self.settings = settings
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # Plugins are loaded once, at start: a package installed later needs a restart.
        self.providers = sorted(providers if providers is not None else connectors.providers())
        self.incarnation = uuid.uuid4()
        self._registered = False  # this incarnation owns the id's row in `workers`
        self._open_here = False  # the id is in this process's _open_here
        self._pool = pool
        # An outcome is repeated while its connection is lost for most of a lease: the lease
        # keeper stops the run before the lease runs out.
        self._store = RunStore(pool, retry=RetryPolicy(within=settings.lease_seconds * 0.8))
        # The one shape of this worker's claims of runs: its id, its lease, its providers.
        self._claim_terms = ClaimTerms(self.id, settings.lease_seconds, self.providers)
        self._url = url
        self._wake = threading.Event()
        self._running = False
        self._stop_requested = False
        self._continuous = False  # run() sets it: finish-and-claim in one round trip
        self._prefetched: ClaimedRun | None = None
        self.heartbeat = Heartbeat(
            pool,
            settings,
            worker_id=self.id,
            incarnation=self.incarnation,
            version=_version(),
            providers=self.providers,
            current_run=lambda: self._current_run_id,
            on_taken_over=self._taken_over,
        )
        self.schedules = ScheduleEnqueuer(pool, settings)
        self.sweeper = SeenKeySweeper(pool, settings, worker_id=self.id)
        self.cleaner = Cleaner(pool, settings, worker_id=self.id)
        self.services: list[Service[Any]] = [
            self.heartbeat,
            self.schedules,
            self.sweeper,
            self.cleaner,
        ]
        # While a run executes, the lease keeper's thread sends the heartbeat when it is due,
        # also when poll() is called without the services' timers.
        self._keeper = LeaseKeeper.for_url(settings, url, on_tick=self.heartbeat.run_if_due)
        # The application queues' lanes, if CONNECTOR_SYNC_LANES gives this process any.
        self.metrics = WorkerMetrics()
        self.metrics.watch(self._keeper_figures)
        self._lanes = (
            Lanes.from_settings(queues, self._keeper, settings, self.metrics) if queues else None
        )
        on_job = self._lanes.wake if self._lanes is not None else None
        self._listener = self._make_listener(url, on_job) if listen else None
        self._executor = Executor(
            self._store, settings, secrets, self._keeper, self.id, metrics=self.metrics
        )
        self._current_run_id: int | None = None
        self.stage_failures: dict[str, int] = {}
        self.database_failures = 0  # consecutive polls in which the database failed
        self.runs_executed = 0
        with pool.connection() as conn:
            check_schema(conn, settings.schema_name)
        self._register()
        if queues is not None:
            lanes = self._lanes.served if self._lanes is not None else {}
            queues.store.set_worker_lanes(self.id, self.incarnation, lanes)
        self.ingestions = IngestionStage(
            pool, settings, secrets, self._keeper, self.id, self.providers,
            stopping=lambda: self._stop_requested, runs_executed=lambda: self.runs_executed,
        )  # fmt: skip
        self._stages: list[tuple[str, Callable[[], bool]]] = [
            ("heartbeat", _inline(self.heartbeat)),
            ("schedules", _inline(self.schedules)),
            ("claim", self._claim_and_execute),
            ("ingestions", self.ingestions.poll),
            ("sweep", _inline(self.sweeper)),
            ("clean", _inline(self.cleaner)),
        ]

    def _make_listener(
        self, url: str, on_job: Callable[[str | None], object] | None
    ) -> Listener | None:
        """The LISTEN connection, on ``listen_url`` if set; none behind a transaction pooler
        without it, where a LISTEN would be lost with its server connection."""
        target = listen_url(self.settings, url)
        if target is None:
            log.info(
                "behind a transaction pooler without CONNECTOR_SYNC_LISTEN_URL: no LISTEN, "
                "the worker polls for work every %.1f s",
                self.settings.poll_interval,
            )
            return None
        return Listener(self.settings, target, self._wake, on_job, worker_id=self.id)

    # -- the loop --------------------------------------------------------------------------

    def poll(self) -> bool:
        """Run every stage once. True if a run was executed (there may be more waiting)."""
        self._keeper.start()
        executed = False
        database_down = False
        for name, stage in self._stages:
            try:
                executed = stage() or executed
            except Exception as exc:
                self.stage_failures[name] = self.stage_failures.get(name, 0) + 1
                if isinstance(exc, psycopg.OperationalError | PoolTimeout):
                    database_down = True
                    log.warning("stage %s failed: %s", name, first_line(exc))
                else:
                    log.exception("stage %s failed", name)
        self.database_failures = self.database_failures + 1 if database_down else 0
        return executed

    def idle_wait(self) -> float:
        """How long the loop sleeps after a poll that ran nothing: the poll interval, doubled
        after each poll the database failed, up to ``max_backoff`` (woken early by NOTIFY)."""
        if self.database_failures == 0:
            return self.settings.poll_interval
        backoff = self.settings.poll_interval * 2**self.database_failures
        return min(backoff, self.settings.max_backoff)

    def run(self, *, once: bool = False, install_signals: bool = True) -> None:
        """Poll until stopped (SIGTERM/SIGINT or ``stop()``). ``once``: a single poll."""
        if install_signals:
            self._install_signal_handlers()
        self._running = True
        self._continuous = not once
        if self._listener is not None and not once:
            self._listener.start()
        if not once:
            for service in self.services:
                service.start()
        if self._lanes is not None and not once:
            self._lanes.start()
        log.info("worker %s started", self.id)
        try:
            while self._running:
                self._wake.clear()
                executed = self.poll()
                if once:
                    break
                if self._listener is not None and not self._listener.alive:
                    log.error("the LISTEN thread died; restarting it")
                    self._listener.start()
                for service in self.services:
                    if service.started and not service.alive:
                        log.error("the %s thread died; restarting it", service.name)
                        service.start()
                if not executed:
                    self._wake.wait(self.idle_wait())
        finally:
            self.close()

    def stop(self) -> None:
        """Graceful shutdown: the running run is handed back to the queue at once."""
        self._running = False
        self._stop_requested = True
        current = self._executor.current
        if current is not None:
            current.trip(AbortReason.SHUTDOWN)
        self._wake.set()

    def close(self) -> None:
        self._running = False
        try:
            self._hand_back_prefetched()
        except Exception as exc:  # its lease expires and another worker takes it
            log.warning("could not hand back the run claimed last: %s", first_line(exc))
        if self._listener is not None:
            self._listener.stop()
        for service in self.services:
            service.stop()
        if self._lanes is not None:
            self._lanes.stop()
        self._keeper.stop()
        self.ingestions.close()
        with _open_here_lock:
            if self._open_here:
                _open_here.discard(self.id)
                self._open_here = False
        if not self._registered:
            return
        self._registered = False
        try:
            self._store.worker_stopped(self.id, self.incarnation, timeout=5)
        except Exception as exc:
            log.warning("could not record the worker's stop: %s", first_line(exc))
        log.info("worker %s stopped", self.id)

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            # A handler runs in the main thread between two of its bytecodes, perhaps while
            # that thread holds a lock stop() needs (inside the wake event's set(), or a log
            # call): stop from a thread of its own, which waits for the lock instead.
            threading.Thread(target=stop, args=(signum,), name="signal", daemon=True).start()

        def stop(signum: int) -> None:
            log.info("received %s: finishing up", signal.Signals(signum).name)
            self.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handle)
            signal.signal(signal.SIGINT, handle)

    # -- registration ----------------------------------------------------------------------

    def _register(self) -> None:
        """Record this incarnation of the worker id, or refuse (Conflict) while another live
        process holds it."""
        with _open_here_lock, self._pool.connection() as conn:
            if self.id in _open_here:
                raise Conflict(
                    f"worker id {self.id!r} is already used by a worker of this process; "
                    "give each worker its own id"
                )
            previous = self._store.get_worker(conn, self.id)
            registered = self._store.register_worker(
                conn,
                worker_id=self.id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                version=_version(),
                providers=self.providers,
                incarnation=self.incarnation,
                stale_seconds=self.settings.stale_after,
                dead=previous if previous is not None and _is_dead_here(previous) else None,
            )
            if not registered:
                raise Conflict(_in_use(self.id, self._store.get_worker(conn, self.id)))
            _open_here.add(self.id)
            self._open_here = True
        self._registered = True
        self.heartbeat.mark_ran()  # registering is the first heartbeat

    # -- stages ----------------------------------------------------------------------------

    def _taken_over(self) -> None:
        """The heartbeat found this worker's id held by a newer process."""
        self._registered = False  # its stop is not this incarnation's to record
        self.stop()

    def _claim_and_execute(self) -> bool:
        if self._stop_requested:
            return False
        run, self._prefetched = self._prefetched, None
        if run is None:
            began = time.monotonic()
            run = self._store.claim(self._terms())
            found = "empty" if run is None else "claimed"
            self.metrics.claim_seconds.labels(found).observe(time.monotonic() - began)
            if run is None:
                return False
        self._current_run_id = run.id  # the next heartbeat says so
        try:
            self._executor.execute(run, seal=self._seal)
        finally:
            self._current_run_id = None
            self.runs_executed += 1
        return True

    def _terms(self) -> ClaimTerms:
        """The claim's terms as of now: an empty claim may mark this worker idle, to be woken
        alone on its own channel, only while its loop runs and its LISTEN connection is up."""
        listener = self._listener
        wakeable = self._continuous and listener is not None and listener.connected.is_set()
        return replace(self._claim_terms, wakeable=wakeable)

    def _seal(self, seal: Seal) -> bool:
        """The finish of the run just executed. In the loop it claims the next run in the same
        round trip (kept for the next poll); a bare poll() (tests, `worker --once`) and a
        worker asked to stop leave nothing claimed behind."""
        if not self._continuous or self._stop_requested:
            return self._store.finish(seal)
        sealed, self._prefetched = self._store.finish_and_claim(seal, self._terms())
        return sealed

    def _keeper_figures(self) -> Iterator[CounterMetricFamily]:
        """What the lease keeper and the poll loop count, for this worker's registry."""
        yield counter_family(
            "lease_losses",
            "Leases this worker found lost (expired, or taken by another worker), by kind of "
            "work: its attempt stopped writing",
            "kind",
            {**dict.fromkeys(LEASE_KINDS, 0), **self._keeper.losses},
        )
        yield counter_family(
            "lease_renewals",
            "Lease renewals that extended a lease, by kind of work",
            "kind",
            {**dict.fromkeys(LEASE_KINDS, 0), **self._keeper.renewals},
        )
        yield counter_family(
            "stage_failures", "Poll stages that raised, by stage", "stage", self.stage_failures
        )

    def _hand_back_prefetched(self) -> None:
        """A run claimed with the last finish but not started: back to the queue, no attempt
        spent."""
        run, self._prefetched = self._prefetched, None
        if run is None:
            return
        seal = Seal(run.lease, "queued", run.results, {}, None)
        self._store.hand_back(seal, timeout=5, repeat=False)
        log.info("handed back run %d, claimed but not started", run.id)


def _inline(service: Service[Any]) -> Callable[[], bool]:
    """A poll stage that runs ``service`` when it is due, unless its own timer runs it."""

    def stage() -> bool:
        if not service.started:
            service.run_if_due()
        return False

    return stage


def _is_dead_here(row: WorkerRow) -> bool:
    """Whether a registered incarnation is a process of this host that no longer runs: its pid
    is gone, or is this very process (a restarted container reuses pids; the caller has made
    sure no open Worker of this process holds the id)."""
    if row.stopped_at is not None or row.hostname != socket.gethostname():
        return False
    if row.pid == os.getpid():
        return True
    try:
        os.kill(row.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a live process of another user
        return False
    return False


def _in_use(worker_id: str, holder: WorkerRow | None) -> str:
    if holder is None:  # it stopped and was removed between our two reads
        return f"worker id {worker_id!r} changed hands while starting; start it again"
    ago = holder.since_heartbeat.total_seconds()
    return (
        f"worker id {worker_id!r} is in use by a live worker (pid {holder.pid} on "
        f"{holder.hostname}, last heartbeat {ago:.0f}s ago); give this one another id "
        "(--id), or stop that one first"
    )
