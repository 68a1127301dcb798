"""``/metrics``: the database's figures in the Prometheus text format, computed at scrape time
by a custom collector (one statement, one snapshot, bounded by a statement timeout).

These figures come from the database, so every replica of the page reports the same thing and
they survive worker restarts: unfinished runs by kind, provider and status; runs finished in the
last hour and the records their syncs upserted, left unchanged and tombstoned; the dead letters;
the run queue's depth, delayed retries and oldest due run; runs whose lease lapsed and the
longest-running run; workers by state; and per application queue its due, delayed and active
jobs, its oldest due job and its dead letters.
What only a worker process sees (how long claims and runs take, lease losses, rate-limit waits)
belongs in that worker's own registry, not here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sync.api import Engine
from sync.overview import MetricsSnapshot
from sync.ui import display

log = logging.getLogger("sync.ui.metrics")

NAV = ("Metrics", "/metrics")
PREFIX = "connector_sync"
RUNS_QUEUE = "runs"  # the `queue` label of the run queue; application queues get their own


class DatabaseCollector(Collector):
    """Reads :meth:`Engine.metrics_snapshot` on every collect. If the database does not answer,
    the scrape still succeeds with ``connector_sync_database_up 0`` and nothing else."""

    def __init__(self, engine: Engine, timeout: float | None = None) -> None:
        self.engine = engine
        # Seconds the snapshot statement may take: a slow database fails the scrape quickly.
        self.timeout = engine.settings.metrics_timeout if timeout is None else timeout

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            f"{PREFIX}_database_up", "1 if the last scrape read the database, else 0"
        )
        try:
            snapshot = self.engine.metrics_snapshot(timeout=self.timeout)
        except Exception as exc:
            log.warning("metrics: the database did not answer: %s", _first_line(exc))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families(snapshot)


def families(snapshot: MetricsSnapshot) -> Iterator[GaugeMetricFamily]:
    window = display.duration(snapshot.window_seconds)
    labels = ["kind", "provider", "status"]
    live = GaugeMetricFamily(
        f"{PREFIX}_runs", "Runs not finished yet (waiting, queued, running)", labels=labels
    )
    for r in snapshot.live:
        live.add_metric([r.kind, r.provider, r.status], r.count)
    yield live
    finished = GaugeMetricFamily(
        f"{PREFIX}_runs_finished", f"Runs that finished in the last {window}", labels=labels
    )
    for r in snapshot.finished:
        finished.add_metric([r.kind, r.provider, r.status], r.count)
    yield finished
    dead = GaugeMetricFamily(
        f"{PREFIX}_runs_dead_letters",
        "Runs that failed for good (status failed) and wait for an operator's retry",
        labels=["kind", "provider"],
    )
    for r in snapshot.dead_letters:
        dead.add_metric([r.kind, r.provider], r.count)
    yield dead

    q = snapshot.queue
    depth = GaugeMetricFamily(
        f"{PREFIX}_queue_depth",
        "Jobs a worker could claim now (queued and due)",
        labels=["queue"],
    )
    depth.add_metric([RUNS_QUEUE], q.due)
    for a in snapshot.app_queues:
        depth.add_metric([a.name], a.due)
    yield depth
    delayed = GaugeMetricFamily(
        f"{PREFIX}_queue_delayed",
        "Jobs queued for later: retries waiting out their backoff or a Retry-After",
        labels=["queue"],
    )
    delayed.add_metric([RUNS_QUEUE], q.delayed)
    for a in snapshot.app_queues:
        delayed.add_metric([a.name], a.delayed)
    yield delayed
    oldest = GaugeMetricFamily(
        f"{PREFIX}_queue_oldest_due_seconds",
        "How long the oldest due job has waited for a worker (0 when none waits)",
        labels=["queue"],
    )
    oldest.add_metric([RUNS_QUEUE], q.oldest_due_seconds or 0.0)
    for a in snapshot.app_queues:
        oldest.add_metric([a.name], a.oldest_due_seconds or 0.0)
    yield oldest
    active = GaugeMetricFamily(
        f"{PREFIX}_queue_active",
        "Jobs of an application queue whose attempt is running",
        labels=["queue"],
    )
    dead_jobs = GaugeMetricFamily(
        f"{PREFIX}_queue_dead_letters",
        "Dead jobs of an application queue (out of attempts) waiting in it for a redrive",
        labels=["queue"],
    )
    for a in snapshot.app_queues:
        active.add_metric([a.name], a.active)
        dead_jobs.add_metric([a.name], a.dead)
    yield active
    yield dead_jobs
    yield _gauge("runs_waiting", "Purges waiting behind their connection's running sync", q.waiting)
    yield _gauge(
        "runs_lease_expired",
        "Runs still marked running whose lease lapsed: their worker died or froze; any live "
        "worker claims them again",
        q.expired_leases,
    )
    yield _gauge(
        "run_oldest_running_seconds",
        "How long the longest-running run has been running (0 when none runs)",
        q.oldest_running_seconds or 0.0,
    )

    records = GaugeMetricFamily(
        f"{PREFIX}_run_records",
        f"Records upserted, unchanged and tombstoned by the syncs that finished in the last "
        f"{window}, from their per-table results",
        labels=["provider", "outcome"],
    )
    for t in snapshot.records:
        records.add_metric([t.provider, "upserted"], t.upserted)
        records.add_metric([t.provider, "unchanged"], t.unchanged)
        records.add_metric([t.provider, "tombstoned"], t.tombstoned)
    yield records

    workers = GaugeMetricFamily(
        f"{PREFIX}_workers",
        "Worker processes by state: alive, stale (no heartbeat for three intervals) or stopped",
        labels=["state"],
    )
    for state, count in snapshot.workers.items():
        workers.add_metric([state.value], count)
    yield workers


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def registry_for(engine: Engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(engine))
    return registry


async def scrape(request: Request) -> Response:
    registry = request.app.state.metrics_registry
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


routes: list[BaseRoute] = [Route("/metrics", scrape)]
