"""A worker process's own figures, in a Prometheus registry of its own that
``connector-sync worker --metrics-port PORT`` serves at ``/metrics``.

These are what only the process sees, so they are counted where it happens and reset when the
process restarts (Prometheus' ``rate()`` and ``increase()`` expect exactly that): how long
claims and attempts of every kind of work take (with a ``kind`` label: run, job, ingestion),
the records its runs upserted, left unchanged and tombstoned, rate-limit waits by provider,
leases it lost, lease renewals, failing poll stages.
Fleet-wide figures (runs by status, queue depths, dead letters, workers alive) come from the
database, at the operator page's ``/metrics``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sync.jobs.outcome import Outcome

PREFIX = "connector_sync_worker"
# Claims are one statement (milliseconds); runs last from seconds to hours.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0)


def outcome_label(outcome: Outcome | None) -> str:
    """How an attempt ended, as a label: its outcome's, or ``error`` if it raised."""
    return "error" if outcome is None else outcome.label


class WorkerMetrics:
    """The registry, and the instruments every kind's attempts record into through the
    executor; a kind adds instruments of its own to ``registry`` (a run's records, its
    rate-limit waits)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.claim_seconds = Histogram(
            f"{PREFIX}_claim_seconds",
            "How long a claim took, by kind of work (run, job, ingestion), scope (an "
            "application job's queue) and whether it found work",
            ["kind", "scope", "result"],
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.attempt_seconds = Histogram(
            f"{PREFIX}_attempt_seconds",
            "How long an attempt took, from its claim to its end, by kind of work (run, job, "
            "ingestion), scope (a run's or an ingestion's provider, a job's queue) and how it "
            "ended (the status it finished with, requeue, wait, hand_back, stop, error)",
            ["kind", "scope", "outcome"],
            buckets=RUN_BUCKETS,
            registry=self.registry,
        )
        # The labelled series already met, looked up without prometheus_client's lock and
        # checks: a worker records one per job of thousands a second.
        self._series: dict[tuple[Histogram, str, str, str], Histogram] = {}

    def claimed(self, kind: str, scope: str, found: int, seconds: float) -> None:
        result = "claimed" if found else "empty"
        self._series_of(self.claim_seconds, kind, scope, result).observe(seconds)

    def attempt_ended(
        self, kind: str, scope: str, outcomes: Sequence[Outcome | None], seconds: float
    ) -> None:
        """An attempt ended: its duration, once per job it held (a batch's jobs share it)."""
        for outcome in outcomes or [None]:
            label = outcome_label(outcome)
            self._series_of(self.attempt_seconds, kind, scope, label).observe(seconds)

    def _series_of(self, histogram: Histogram, kind: str, scope: str, label: str) -> Histogram:
        key = (histogram, kind, scope, label)
        series = self._series.get(key)
        if series is None:
            series = self._series.setdefault(key, histogram.labels(kind, scope, label))
        return series

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
