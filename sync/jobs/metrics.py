"""A worker process's own figures, in a Prometheus registry of its own that
``connector-sync worker --metrics-port PORT`` serves at ``/metrics``.

These are what only the process sees, so they are counted where it happens and reset when the
process restarts (Prometheus' ``rate()`` and ``increase()`` expect exactly that): how long
claims, runs and application jobs take, the records its runs upserted, left unchanged and
tombstoned, rate-limit waits by provider, leases it lost, lease renewals, failing poll stages.
Fleet-wide figures (runs by status, queue depths, dead letters, workers alive) come from the
database, at the operator page's ``/metrics``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sync.jobs.outcome import Action, Outcome, TableResult

PREFIX = "connector_sync_worker"
# Claims are one statement (milliseconds); runs last from seconds to hours.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0)


def outcome_label(outcome: Outcome | None) -> str:
    """How an attempt ended, as a label: the run's final status when it finished, else what
    happened to it (requeue, wait, hand_back, stop), or ``error`` if it raised."""
    if outcome is None:
        return "error"
    if outcome.action is Action.FINISH:
        return outcome.status or "finished"
    return outcome.action.value


class WorkerMetrics:
    """The registry and the instruments the worker's stages record into."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.claim_seconds = Histogram(
            f"{PREFIX}_claim_seconds",
            "How long a claim of the run queue took, by whether it found a run",
            ["result"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.run_seconds = Histogram(
            f"{PREFIX}_run_seconds",
            "How long an attempt of a run took, from its claim to its end, by how it ended",
            ["kind", "provider", "outcome"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.job_claim_seconds = Histogram(
            f"{PREFIX}_job_claim_seconds",
            "How long a lane's claim of an application queue took",
            ["queue"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.job_seconds = Histogram(
            f"{PREFIX}_job_seconds",
            "How long an attempt of an application job took in a lane, by how it ended "
            "(completed, failed, or lost: cancelled or taken back meanwhile)",
            ["queue", "outcome"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.records = Counter(
            f"{PREFIX}_records",
            "Records this worker's syncs upserted, left unchanged and tombstoned",
            ["provider", "outcome"],
            registry=r,
        )
        self.rate_limit_waits = Counter(
            f"{PREFIX}_rate_limit_waits",
            "Waits for a spent rate limit: slept inside the run (where=inline), or ending the "
            "attempt while the run waits in the queue until it resets (where=queue)",
            ["provider", "where"],
            registry=r,
        )
        self.rate_limit_wait_seconds = Counter(
            f"{PREFIX}_rate_limit_wait_seconds",
            "Seconds of those waits: slept inside the run, or that the run was told to wait",
            ["provider", "where"],
            registry=r,
        )

    def attempt_ended(
        self,
        kind: str,
        provider: str,
        outcome: Outcome | None,
        seconds: float,
        tables: Mapping[str, TableResult],
        waits_slept: Sequence[float] = (),
    ) -> None:
        """An attempt of a run ended: its duration, its records, its rate-limit waits (those
        ``waits_slept`` inside it, and the one it ends with)."""
        self.run_seconds.labels(kind, provider, outcome_label(outcome)).observe(seconds)
        if tables:
            for name, value in (
                ("upserted", sum(t.upserted for t in tables.values())),
                ("unchanged", sum(t.unchanged for t in tables.values())),
                ("tombstoned", sum(t.tombstoned for t in tables.values())),
            ):
                self.records.labels(provider, name).inc(value)
        for seconds in waits_slept:
            self.rate_limit_waits.labels(provider, "inline").inc()
            self.rate_limit_wait_seconds.labels(provider, "inline").inc(seconds)
        if outcome is not None and outcome.action is Action.WAIT:
            self.rate_limit_waits.labels(provider, "queue").inc()
            self.rate_limit_wait_seconds.labels(provider, "queue").inc(outcome.delay or 0.0)

    def watch(self, read: Callable[[], Iterator[CounterMetricFamily]]) -> None:
        """Export figures another object keeps (the lease keeper's losses), read at scrape
        time."""
        self.registry.register(_Reading(read))


class _Reading(Collector):
    def __init__(self, read: Callable[[], Iterator[CounterMetricFamily]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield from self._read()


def counter_family(
    name: str, documentation: str, label: str, values: Mapping[str, int]
) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class MetricsServer:
    """Serves a registry at ``http://HOST:PORT/metrics`` from a thread, until stopped."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        server, thread = start_http_server(port, addr=host, registry=registry)
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
