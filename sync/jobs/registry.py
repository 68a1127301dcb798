"""Where the worker finds the kinds it runs: each kind registers a factory that, given what a
worker is made of, says which slots of it this worker runs (a kind, and how many of its units at
once). The engine's own kinds (sync runs, application jobs, ingestions) are registered under the
entry-point group ``connector_sync.kinds``, like any package's; code may also call
:func:`register`. Adding a kind changes neither the seam, nor the worker, nor the lease code."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any
from uuid import UUID

from sync.base.secrets import SecretBox
from sync.base.settings import Settings
from sync.jobs.kind import Kind
from sync.jobs.metrics import WorkerMetrics
from sync.store.db import Pool

GROUP = "connector_sync.kinds"


@dataclass(frozen=True)
class WorkerParts:
    """What a worker is made of, for a kind to build itself from."""

    pool: Pool
    settings: Settings
    secrets: SecretBox | None
    worker_id: str
    incarnation: UUID  # this start of the worker's process
    # The providers whose syncs this worker runs now: its plugins, and the declared providers
    # loaded so far (read it at each claim).
    providers: Callable[[], Sequence[str]]
    metrics: WorkerMetrics
    queues: Any = None  # the application queues of this process, their handlers registered
    listening: Callable[[], bool] = lambda: False  # the worker's LISTEN connection is up
    stopping: Callable[[], bool] = lambda: False  # the worker was asked to stop


@dataclass(frozen=True)
class SlotSpec:
    """One slot of a worker: a kind, and how many of its units it runs at once (its lanes).
    ``main``: the worker's loop runs it, one unit at a time. ``claims_ahead``: an idle lane
    claims for every lane not running a unit, and as many again, so short units never wait
    for a claim. ``claims_overlap``: a claim takes one unit (a batch); the slot has a thread
    more than its lanes, and while claims find work two threads claim at once, so a claim's
    statement runs while the other's rows are read and the next unit waits for a lane, held.
    ``wakes_on``: the notification (``job:<wakes_on>``) that wakes the slot."""

    kind: Kind[Any, Any]
    lanes: int = 1
    main: bool = False
    claims_ahead: bool = False
    claims_overlap: bool = False
    wakes_on: str | None = None
    services: Sequence[Any] = field(default_factory=tuple)  # sync.jobs.service.Service


Factory = Callable[[WorkerParts], Sequence[SlotSpec]]

_registered: dict[str, Factory] = {}
_lock = threading.Lock()


def register(name: str, factory: Factory) -> None:
    """Make a kind known to every worker this process makes from now on."""
    with _lock:
        _registered[name] = factory


def unregister(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def installed() -> dict[str, Factory]:
    """The kinds installed by entry points, then those registered in this process (a name
    registered here wins)."""
    found: dict[str, Factory] = {
        point.name: point.load()
        for point in sorted(entry_points(group=GROUP), key=lambda p: p.name)
    }
    with _lock:
        found.update(_registered)
    return found
