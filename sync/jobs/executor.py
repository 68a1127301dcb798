"""The one executor: runs a claimed unit of any kind, the same way for every kind.

For each unit: hold its leases (the worker's one lease keeper renews and controls them, and
trips the unit's abort signal on a lost lease, a cancel or the timeout), open its log and its
span, handle it, decide, apply, and release the leases; the attempt's duration goes to the
worker's metrics with the kind's name as the ``kind`` label, whatever happened. A shutdown
trips the abort signal of every attempt running here (:meth:`Executor.stop`). The executor never
claims: the worker's slots do, and hand it what they claimed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sync.base import tracing
from sync.base.abort import AbortReason, AbortSignal
from sync.jobs.kind import Handling, Kind
from sync.jobs.lease import LeaseKeeper, Watch
from sync.jobs.log import job_log
from sync.jobs.metrics import WorkerMetrics, outcome_label
from sync.jobs.outcome import Outcome


@dataclass(eq=False)
class Held:
    """The leases of one claimed unit, watched by the keeper from its claim on, and the abort
    signal its attempt listens to (the first lease's)."""

    abort: AbortSignal
    watches: list[Watch]
    began: float  # time.monotonic() at the claim


class Executor:
    def __init__(
        self, keeper: LeaseKeeper, worker_id: str, metrics: WorkerMetrics | None = None
    ) -> None:
        self._keeper = keeper
        self._worker_id = worker_id
        self._metrics = metrics
        self._running: set[AbortSignal] = set()
        self._lock = threading.Lock()
        self._stopping: AbortReason | None = None

    def start(self) -> None:
        """Start the lease keeper's thread (if it is not running yet)."""
        self._keeper.start()

    def hold(self, kind: Kind[Any, Any], unit: Any) -> Held:
        """Have the keeper hold the leases of a unit just claimed (also while it waits for a
        lane)."""
        holds = kind.holds(unit)
        watches = []
        if kind.lease_kind is not None:
            leases = [(h.lease, h.abort, h.terms) for h in holds]
            watches = self._keeper.watch_all(leases, kind=kind.lease_kind)
        abort = holds[0].abort if holds else AbortSignal()
        return Held(abort, watches, time.monotonic())

    def release(self, held: Held) -> None:
        self._keeper.release_all(held.watches)

    def run(self, kind: Kind[Any, Any], unit: Any, held: Held | None = None) -> list[Outcome]:
        """One attempt at ``unit``: handle, decide, apply; its leases released at the end. The
        outcomes, one per job of the unit (none when the kind raised)."""
        held = held or self.hold(kind, unit)
        labels = kind.labels(unit)
        log = job_log(kind.name, labels.ids, self._worker_id)
        for watch in held.watches:
            watch.log = log
        handling = Handling(held.abort, log)
        with self._lock:
            self._running.add(held.abort)
            if self._stopping is not None:
                held.abort.trip(self._stopping)
        span = None
        if tracing.active():
            span = tracing.begin(
                f"connector_sync.{kind.name}",
                {
                    **{f"connector_sync.{key}": value for key, value in labels.ids.items()},
                    "connector_sync.kind": kind.name,
                    "connector_sync.scope": labels.scope,
                    "connector_sync.worker_id": self._worker_id,
                },
            )
        outcomes: Sequence[Outcome] = []
        try:
            handled = kind.handle(unit, handling)
            outcomes = kind.decide(unit, handled, handling)
            kind.apply(unit, handled, outcomes, handling)
            return list(outcomes)
        except Exception:
            # A bug of the kind's: its lease runs out, and the claim takes the unit back.
            log.exception("the %s's attempt failed unexpectedly", kind.name)
            return []
        finally:
            self.release(held)
            with self._lock:
                self._running.discard(held.abort)
            elapsed = time.monotonic() - held.began
            if self._metrics is not None:
                self._metrics.attempt_ended(kind.name, labels.scope, outcomes, elapsed)
            if span is not None:
                _end_span(span, outcomes)

    def running(self) -> list[AbortSignal]:
        """The abort signals of the attempts running here now."""
        with self._lock:
            return list(self._running)

    def stop(self, reason: AbortReason = AbortReason.SHUTDOWN) -> None:
        """Trip the abort signal of every attempt running here, and of any that starts later."""
        with self._lock:
            self._stopping = reason
            running = list(self._running)
        for abort in running:
            abort.trip(reason)

    def resume(self) -> None:
        """Attempts started from now on run again (a worker that was stopped starts again)."""
        with self._lock:
            self._stopping = None


# How an attempt ended that marks its span as failed.
_FAILED = frozenset({"failed", "dead", "requeue"})


def _end_span(span: tracing.Open, outcomes: Sequence[Outcome]) -> None:
    labels = [outcome_label(o) for o in outcomes]
    failed = [o for o in outcomes if outcome_label(o) in _FAILED]
    error = None
    if not outcomes:
        error = "the attempt raised"
    elif failed:
        first = failed[0]
        error = first.error.message if first.error is not None else outcome_label(first)
    outcome = ",".join(dict.fromkeys(labels)) or "error"
    tracing.end(span, {"connector_sync.outcome": outcome}, error=error)
