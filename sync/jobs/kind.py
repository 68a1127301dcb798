"""The seam every kind of leased work plugs into: what the worker's one executor needs of a kind.

A kind is a package (sync runs, application jobs, ingestions, or one of an application's own)
that claims units of work from its own table, holds each by a lease the worker's lease keeper
renews and controls (:class:`~sync.jobs.lease.LeaseKind`), handles one, decides what becomes of
it in the one outcome vocabulary (:mod:`sync.jobs.outcome`), and applies that decision with
writes fenced by the lease. The executor (:mod:`sync.jobs.executor`) does the rest the same way
for every kind: the abort signal, the log, the span, the metrics, holding the lease from the
claim to the last write. The seam imports no kind; a kind registers itself
(:mod:`sync.jobs.registry`), and the worker runs it in a slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sync.base.abort import AbortSignal
from sync.jobs.lease import LeaseKind, Terms
from sync.jobs.log import JobLog
from sync.jobs.outcome import Outcome
from sync.store.rows import Lease

U = TypeVar("U")
"""A claimed unit of work: a run, an application job (or a batch of them), an ingestion."""
H = TypeVar("H")
"""What handling a unit gave, for the kind's decision and its writes."""


@dataclass(frozen=True)
class Hold:
    """A lease a claimed unit holds, the terms it is held on, and the abort signal that its
    loss, a cancel of its work or its timeout trips."""

    lease: Lease
    terms: Terms
    abort: AbortSignal = field(default_factory=AbortSignal)


@dataclass(frozen=True)
class Labels:
    """Who a unit is: the ids every line of its log carries (run, connection, attempt...), and
    the scope of its metrics (the provider of a run or an ingestion, an application job's
    queue)."""

    ids: Mapping[str, Any]
    scope: str


@dataclass(frozen=True)
class Handling:
    """What a kind is given while it handles one attempt at a claimed unit: the abort signal
    everything in the attempt listens to (the kind's HTTP client, its writes, the handler of an
    application job), and the log whose every line names the attempt."""

    abort: AbortSignal
    log: JobLog


class Kind(Protocol, Generic[U, H]):
    """A kind of leased work. The executor calls, for each unit a claim gave: ``holds`` (the
    keeper holds the leases from then on), ``labels``, ``handle``, ``decide``, ``apply``; a
    unit claimed but never run (the worker stops) goes back with ``hand_back``."""

    name: str
    """The kind's word: the ``kind`` label of the worker's metrics, the name of its spans and
    its logger (``sync.<name>``): ``run``, ``job``, ``ingestion``."""
    lease_kind: LeaseKind | None
    """How the lease keeper renews and controls a unit's lease; None for a kind whose units
    hold none (they are reclaimed by a timestamp), which the keeper leaves alone."""

    def claim(self, limit: int) -> Sequence[U]:
        """Up to ``limit`` units this worker now holds (fewer, or none, when fewer are due)."""
        ...

    def holds(self, unit: U) -> Sequence[Hold]:
        """The leases a claimed unit holds (one; a batch of application jobs holds one each;
        a unit that holds none, none): each watched by the lease keeper until the unit's
        attempt ends."""
        ...

    def labels(self, unit: U) -> Labels: ...

    def handle(self, unit: U, handling: Handling) -> H:
        """Do the work. What went wrong is part of what it returns, for :meth:`decide`: it
        raises only for a bug of its own, which the executor logs and leaves to the lease."""
        ...

    def decide(self, unit: U, handled: H, handling: Handling) -> Sequence[Outcome]:
        """What becomes of the unit: an outcome per job in it (pure, at the kind's clock)."""
        ...

    def apply(self, unit: U, handled: H, outcomes: Sequence[Outcome], handling: Handling) -> None:
        """Write the outcomes, each fenced by its lease (a stale owner's write matches
        nothing)."""
        ...

    def hand_back(self, unit: U) -> None:
        """A unit claimed but not run: back to its queue, no attempt spent."""
        ...

    def start(self) -> None:
        """The worker's loop begins (``worker --once`` never calls it)."""
        return None

    def stop(self) -> None:
        """The worker stops: whatever the kind claimed ahead and did not start goes back."""
        return None
