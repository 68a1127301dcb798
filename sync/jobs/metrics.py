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
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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
        self.claim_seconds = Durations(
            f"{PREFIX}_claim_seconds",
            "How long a claim took, by kind of work (run, job, ingestion), scope (an "
            "application job's queue) and whether it found work",
            ("kind", "scope", "result"),
            CLAIM_BUCKETS,
        )
        self.attempt_seconds = Durations(
            f"{PREFIX}_attempt_seconds",
            "How long an attempt took, from its claim to its end, by kind of work (run, job, "
            "ingestion), scope (a run's or an ingestion's provider, a job's queue) and how it "
            "ended (the status it finished with, requeue, wait, hand_back, stop, error)",
            ("kind", "scope", "outcome"),
            RUN_BUCKETS,
        )
        self.registry.register(self.claim_seconds)
        self.registry.register(self.attempt_seconds)

    def claimed(self, kind: str, scope: str, found: int, seconds: float) -> None:
        result = "claimed" if found else "empty"
        self.claim_seconds.observe((kind, scope, result), seconds)

    def attempt_ended(
        self, kind: str, scope: str, outcomes: Sequence[Outcome | None], seconds: float
    ) -> None:
        """An attempt ended: its duration, once per job it held (a batch's jobs share it)."""
        if len(outcomes) <= 1:  # one job, or none when the attempt raised
            label = outcome_label(outcomes[0] if outcomes else None)
            self.attempt_seconds.observe((kind, scope, label), seconds)
            return
        ended = Counter(outcome_label(outcome) for outcome in outcomes)
        for label, jobs in ended.items():
            self.attempt_seconds.observe((kind, scope, label), seconds, jobs)

    def watch(self, read: Callable[[], Iterator[CounterMetricFamily]]) -> None:
        """Export figures another object keeps (the lease keeper's losses), read at scrape
        time."""
        self.registry.register(_Reading(read))


class Durations(Collector):
    """A histogram of durations by labels, kept here and read at scrape time. A batch's
    attempt is one observation per job, taken at once under one lock: prometheus_client's
    Histogram takes a lock per observation and per bucket, a cost a worker of thousands of
    jobs a second feels."""

    def __init__(
        self, name: str, documentation: str, labels: tuple[str, ...], buckets: Sequence[float]
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._bounds = list(buckets)
        self._les = [*map(floatToGoString, buckets), "+Inf"]
        self._lock = threading.Lock()
        # Per label values: the count of each bucket (the last one +Inf), then the sum.
        self._series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], seconds: float, count: int = 1) -> None:
        bucket = bisect_left(self._bounds, seconds)  # the first bound at or above: its "le"
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = [0.0] * (len(self._les) + 1)
            series[bucket] += count
            series[-1] += seconds * count

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labels)
        with self._lock:
            series = sorted((labels, list(values)) for labels, values in self._series.items())
        for labels, values in series:
            cumulative, buckets = 0.0, []
            for le, count in zip(self._les, values, strict=False):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(labels), buckets, values[-1])
        yield family


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
