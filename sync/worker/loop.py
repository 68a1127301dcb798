"""The worker process: it runs slots, each a kind of leased work (``sync.jobs``) and how many of
its units at once. The main slot runs sync runs one at a time, awaited inline in the loop (scale
by running more processes); lane slots run application jobs and ingestions on threads of their
own (``sync.worker.slots``), every unit through the one executor.

``Worker.poll()`` runs a fixed list of stages once (heartbeat, due schedules, one unit of the
main slot, one of each lane slot not running on its own threads, sweep of seen keys, retention,
the kinds' services), each wrapped so one failing stage never skips the others. ``run()`` loops
``poll(); wait(poll_interval)``, woken early by LISTEN/NOTIFY, starts the lane slots' threads,
and runs each service (``sync.worker.services``) on a timer thread of its own meanwhile, so a
run that executes for hours starves none of them; ``poll()`` then leaves them to their threads
and timers. Tests call ``poll()``, with no threads and no timers.

A worker registers when it is created: its own incarnation of its id (process, host, version,
start time) and the providers whose connectors it has: its installed plugins, loaded once, and
the declared providers of the database, loaded again every ``providers_interval``. It claims only
syncs of those providers; a second live worker with the same id is refused.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from types import FrameType
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily
from psycopg_pool import PoolTimeout

from connectors.registry import plugins
from sync.base.abort import AbortReason
from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.errors import Conflict
from sync.jobs.executor import Executor
from sync.jobs.lease import LeaseKeeper
from sync.jobs.metrics import WorkerMetrics, counter_family
from sync.jobs.registry import Factory, WorkerParts
from sync.jobs.service import Service
from sync.store import RunStore, WorkerRow
from sync.store.db import Pool, first_line, listen_url
from sync.store.migrations import check_schema
from sync.worker.listener import Listener
from sync.worker.services import (
    Cleaner,
    Heartbeat,
    ProviderLoader,
    ScheduleEnqueuer,
    SeenKeySweeper,
)
from sync.worker.slots import Slot

log = logging.getLogger("sync.worker")

# The poll stage of the main slot.
MAIN_STAGE = "claim"

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
        queues: Any = None,
        kinds: Sequence[Factory] = (),
    ) -> None:
        """``kinds``: the factories of the kinds this worker runs (``sync.jobs.registry``), each
        giving its slots; ``queues``: the application queues of this process, with their
        handlers registered, for the kind that runs their jobs."""
        self.settings = settings
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # Plugins are loaded once, at start: a package installed later needs a restart. Declared
        # providers are loaded from the database now and every providers_interval.
        self._plugins = sorted(providers if providers is not None else plugins())
        self.provider_loader = ProviderLoader(pool, settings)
        self.incarnation = uuid.uuid4()
        self._registered = False  # this incarnation owns the id's row in `workers`
        self._open_here = False  # the id is in this process's _open_here
        self._closed = False
        self._pool = pool
        self._store = RunStore(pool)
        self._url = url
        self._wake = threading.Event()
        self._running = False
        self._stop_requested = False
        self.heartbeat = Heartbeat(
            pool,
            settings,
            worker_id=self.id,
            incarnation=self.incarnation,
            version=_version(),
            providers=lambda: self.providers,
            current_run=self._current_run_id,
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
            self.provider_loader,
        ]
        # While a unit runs, the lease keeper's thread also sends the heartbeat when it is due,
        # also when poll() is called without the services' timers.
        self._keeper = LeaseKeeper.for_url(settings, url, on_tick=self.heartbeat.run_if_due)
        self.metrics = WorkerMetrics()
        self.metrics.watch(self._keeper_figures)
        self._executor = Executor(self._keeper, self.id, self.metrics)
        self._listener = self._make_listener(url) if listen else None
        self.stage_failures: dict[str, int] = {}
        self._ran_main = False  # in the poll under way, the main slot ran a unit
        self.database_failures = 0  # consecutive polls in which the database failed
        with pool.connection() as conn:
            check_schema(conn, settings.schema_name)
        self.provider_loader.run_once()
        self._register()
        parts = WorkerParts(
            pool=pool,
            settings=settings,
            secrets=secrets,
            worker_id=self.id,
            incarnation=self.incarnation,
            providers=lambda: self.providers,
            metrics=self.metrics,
            queues=queues,
            listening=self._listening,
            stopping=lambda: self._stop_requested,
        )
        self.slots: list[Slot] = []
        self._main: Slot | None = None
        self._lanes: list[Slot] = []
        try:
            for factory in kinds:
                for spec in factory(parts):
                    self.slots.append(
                        Slot(
                            spec,
                            self._executor,
                            poll_interval=settings.poll_interval,
                            metrics=self.metrics,
                        )
                    )
                    self.services.extend(spec.services)
        except BaseException:
            self.close()
            raise
        mains = [slot for slot in self.slots if slot.spec.main]
        self._main = mains[0] if mains else None
        self._lanes = [slot for slot in self.slots if not slot.spec.main]
        self._stages: list[tuple[str, Callable[[], bool]]] = [
            ("heartbeat", _inline(self.heartbeat)),
            ("schedules", _inline(self.schedules)),
            ("providers", _inline(self.provider_loader)),
            *((MAIN_STAGE, _run_once(slot)) for slot in mains[:1]),
            *((_stage_name(slot), _run_once(slot, lambda: self._ran_main)) for slot in self._lanes),
            ("sweep", _inline(self.sweeper)),
            ("clean", _inline(self.cleaner)),
            *((service.name, _inline(service)) for service in self.services[5:]),
        ]

    def _make_listener(self, url: str) -> Listener | None:
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
        return Listener(self.settings, target, self._wake, self._wake_slots, worker_id=self.id)

    def _wake_slots(self, queue: str | None) -> None:
        """A notification for the lanes: of one application queue, or (None) for all."""
        for slot in self._lanes:
            if queue is None or slot.spec.wakes_on == queue or slot.spec.wakes_on is None:
                slot.wake()

    def _listening(self) -> bool:
        listener = self._listener
        return self._running and listener is not None and listener.connected.is_set()

    @property
    def providers(self) -> list[str]:
        """The providers this worker runs: its plugins and the declared providers loaded."""
        return sorted({*self._plugins, *self.provider_loader.names})

    @property
    def runs_executed(self) -> int:
        return self._main.units_run if self._main is not None else 0

    def slot(self, kind: str) -> Slot:
        """The (first) slot of a kind, by its name."""
        return next(s for s in self.slots if s.kind.name == kind)

    # -- the loop --------------------------------------------------------------------------

    def poll(self) -> bool:
        """Run every stage once. True if a slot ran a unit (there may be more waiting)."""
        self._keeper.start()
        executed = False
        database_down = False
        self._ran_main = False
        for name, stage in self._stages:
            try:
                ran = stage()
                executed = ran or executed
                self._ran_main = self._ran_main or (ran and name == MAIN_STAGE)
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
        self._closed = False
        if not once:
            # What is alive now (the libraries, the application's handlers, the settings)
            # lives as long as the process. Frozen, it is out of the cyclic collector's reach:
            # a full collection walks what came after, not every object of the imported
            # libraries while every lane waits for it.
            gc.freeze()
            if self._listener is not None:
                self._listener.start()
            for service in self.services:
                service.start()
            for slot in self._lanes:
                slot.start()
            if self._main is not None:
                self._main.kind.start()
        log.info("worker %s started", self.id)
        try:
            while self._running:
                self._wake.clear()
                executed = self.poll()
                if once:
                    break
                self._restart_what_died()
                if not executed:
                    self._wake.wait(self.idle_wait())
        finally:
            self.close()

    def _restart_what_died(self) -> None:
        if self._listener is not None and not self._listener.alive:
            log.error("the LISTEN thread died; restarting it")
            self._listener.start()
        for service in self.services:
            if service.started and not service.alive:
                log.error("the %s thread died; restarting it", service.name)
                service.start()

    def stop(self) -> None:
        """Graceful shutdown: every running unit is handed back to its queue at once."""
        self._running = False
        self._stop_requested = True
        self._executor.stop(AbortReason.SHUTDOWN)
        self._wake.set()

    def close(self) -> None:
        """Stop every part of the worker and release its id; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        if self._main is not None:
            try:
                self._main.kind.stop()
            except Exception as exc:  # its lease expires and another worker takes it
                log.warning("could not hand back the run claimed last: %s", first_line(exc))
        if self._listener is not None:
            self._listener.stop()
        for service in self.services:
            service.stop()
        for slot in self._lanes:
            slot.stop()
        self._keeper.stop()
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

    def _current_run_id(self) -> int | None:
        """The run the main slot is running, for the heartbeat."""
        main = self._main
        for unit in main.running if main is not None else ():
            return getattr(unit, "id", None)
        return None

    def _keeper_figures(self) -> Iterator[CounterMetricFamily]:
        """What the lease keeper and the poll loop count, for this worker's registry."""
        yield counter_family(
            "lease_losses",
            "Leases this worker found lost (expired, or taken by another worker), by kind of "
            "work: its attempt stopped writing",
            "kind",
            {**dict.fromkeys(self._kinds(), 0), **self._keeper.losses},
        )
        yield counter_family(
            "lease_renewals",
            "Lease renewals that extended a lease, by kind of work",
            "kind",
            {**dict.fromkeys(self._kinds(), 0), **self._keeper.renewals},
        )
        yield counter_family(
            "stage_failures", "Poll stages that raised, by stage", "stage", self.stage_failures
        )

    def _kinds(self) -> list[str]:
        """The kinds of leased work this worker runs, exported as zeros before their first
        lease is lost."""
        return sorted({s.kind.lease_kind.name for s in self.slots if s.kind.lease_kind})


def _stage_name(slot: Slot) -> str:
    scope = slot.spec.wakes_on
    return f"{slot.kind.name}:{scope}" if scope else slot.kind.name


def _run_once(slot: Slot, busy: Callable[[], bool] = lambda: False) -> Callable[[], bool]:
    """A poll stage that runs one unit of ``slot`` when no thread of its own runs it; ``busy``:
    whether the main slot ran a unit in this poll."""

    def stage() -> bool:
        if slot.started:
            return False
        return slot.run_once(busy=busy())

    return stage


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
