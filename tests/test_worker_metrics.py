"""A worker's own Prometheus registry: after a scripted set of runs its claim and run
histograms, record counters and rate-limit waits equal what the database says those runs did;
a lease taken from it under a running sync is counted; ``--metrics-port`` serves the registry
over HTTP, parsed by the Prometheus client's own parser."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from connectors import PermanentError
from connectors.errors import RateLimited
from sync import Engine
from sync.jobs.lease import LeaseKeeper
from sync.jobs.metrics import MetricsServer, WorkerMetrics
from sync.queues import Job, JobStatus, queue_spec
from sync.queues.postgres import PostgresQueues
from sync.queues.retries import COMPLETE, DEAD
from sync.store.db import connect
from sync.testing import run_sync
from tests.conftest import make_settings
from tests.lanes_support import Lanes
from tests.test_sync_flow import items, new_dataset
from tests.ui_support import GATES, new_gate
from tests.waiting import until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def of(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_workers_registry_matches_what_its_runs_did(engine: Engine) -> None:
    ws = engine.create_workspace("acme")
    worker = engine.worker(listen=False)

    def connection(name: str, rows: int, failure: BaseException | None = None) -> int:
        key, data = new_dataset(items=items(*range(rows)))
        if failure is not None:
            data.failures["items"] = (0, failure)
        data.rate_limit_sleeps["items"] = 0.0  # a Retry-After: 0 slept inside the run
        return engine.create_connection(ws.id, name, "memory", config={"dataset": key}).id

    ok = connection("ok", 7)
    first = run_sync(engine, ok, worker=worker)
    second = run_sync(engine, ok, worker=worker)  # everything unchanged
    failed = run_sync(engine, connection("broken", 1, PermanentError("refused")), worker=worker)
    assert (first.status, second.status, failed.status) == ("succeeded", "succeeded", "partial")
    limited = engine.sync(connection("limited", 1, RateLimited("slow down", retry_after=120)))
    worker.poll()
    assert engine.run(limited.id).waits == 1 and engine.run(limited.id).status == "queued"
    worker.poll()  # nothing due: an empty claim

    samples = parse(generate_latest(worker.metrics.registry).decode())

    # Records: the sums of the per-table results the database holds for these runs.
    for outcome in ("upserted", "unchanged", "tombstoned"):
        expected = sum(
            t.get(outcome, 0) for run in engine.runs(limit=100) for t in run.results.values()
        )
        counted = of(
            samples, "connector_sync_worker_records_total", provider="memory", outcome=outcome
        )
        assert counted == expected, outcome
    assert (
        of(samples, "connector_sync_worker_records_total", provider="memory", outcome="upserted")
        == 7
    )
    assert (
        of(samples, "connector_sync_worker_records_total", provider="memory", outcome="unchanged")
        == 7
    )

    run = "connector_sync_worker_attempt_seconds_count"
    assert of(samples, run, kind="run", scope="memory", outcome="succeeded") == 2
    assert of(samples, run, kind="run", scope="memory", outcome="partial") == 1
    assert of(samples, run, kind="run", scope="memory", outcome="wait") == 1
    attempts = sum(len(engine.attempts(r.id)) for r in engine.runs(limit=100))
    runs = [v for (n, labels), v in samples.items() if n == run and ("kind", "run") in labels]
    assert sum(runs) == attempts

    claims = "connector_sync_worker_claim_seconds_count"
    assert of(samples, claims, kind="run", scope="", result="claimed") == attempts
    assert of(samples, claims, kind="run", scope="", result="empty") >= 1

    waits, seconds = (
        "connector_sync_worker_rate_limit_waits_total",
        "connector_sync_worker_rate_limit_wait_seconds_total",
    )
    assert of(samples, waits, provider="memory", where="queue") == 1
    assert 60 <= of(samples, seconds, provider="memory", where="queue") <= 120
    # Every attempt that read the items table slept one wait inside the run first.
    assert of(samples, waits, provider="memory", where="inline") == attempts
    assert of(samples, seconds, provider="memory", where="inline") == 0
    for kind in ("run", "ingestion"):  # the kinds this worker runs (it serves no queue)
        assert of(samples, "connector_sync_worker_lease_losses_total", kind=kind) == 0
    worker.close()


@pytest.fixture
def fast_engine(schema: str) -> Iterator[Engine]:
    settings = make_settings(schema, batch_size=25, control_interval=0.05)
    with Engine(settings, pool_size=6) as engine:
        engine.migrate()
        yield engine


def test_a_lease_taken_from_a_running_sync_is_counted(fast_engine: Engine, admin: Any) -> None:
    engine = fast_engine
    ws = engine.create_workspace("acme")
    gate = new_gate(rows=100, pause_at=50)  # never released: the lost lease ends the read
    connection = engine.create_connection(ws.id, "gated", "ui_gated", config={"gate": gate})
    run = engine.sync(connection.id)
    worker = engine.worker(listen=False)
    polling = threading.Thread(target=worker.poll)
    polling.start()
    assert GATES[gate].reached.wait(60)
    # Another worker's claim, as the database would see it after this one froze.
    admin.execute(
        "UPDATE connection_runs SET lease_owner = gen_random_uuid() WHERE id = %s", (run.id,)
    )
    polling.join(60)
    assert not polling.is_alive()
    samples = parse(generate_latest(worker.metrics.registry).decode())
    assert of(samples, "connector_sync_worker_lease_losses_total", kind="run") == 1
    assert (
        of(
            samples,
            "connector_sync_worker_attempt_seconds_count",
            kind="run",
            scope="ui_gated",
            outcome="stop",
        )
        == 1
    )
    worker.close()


def test_the_metrics_port_serves_the_registry(engine: Engine) -> None:
    worker = engine.worker(listen=False)
    worker.poll()
    served = MetricsServer(worker.metrics.registry, "127.0.0.1", 0)
    try:
        response = httpx.get(f"http://127.0.0.1:{served.port}/metrics")
        assert response.status_code == 200
        samples = parse(response.text)
        claims = "connector_sync_worker_claim_seconds_count"
        assert of(samples, claims, kind="run", scope="", result="empty") == 1
        with pytest.raises(OSError):
            MetricsServer(worker.metrics.registry, "127.0.0.1", served.port)
    finally:
        served.stop()
        worker.close()


def test_lanes_time_their_claims_and_each_jobs_attempt(engine: Engine) -> None:
    settings = engine.settings.model_copy(update={"poll_interval": 0.05})
    url = engine.settings.database_url
    assert url is not None
    keeper = LeaseKeeper(settings, lambda: connect(settings, url))
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("mail", retry_limit=0))

    def deliver(job: Job, abort: Any) -> None:
        if job.payload["bounce"]:
            raise RuntimeError("mailbox unavailable")

    queues.register("mail", deliver)
    bounced = queues.send("mail", {"bounce": True})  # one lane: it runs first, then the other
    delivered = queues.send("mail", {"bounce": False})
    metrics = WorkerMetrics()
    lanes = Lanes(queues, {"mail": 1}, keeper, settings, metrics)
    lanes.start()
    try:
        until(
            lambda: queues.get_job(delivered).status is JobStatus.COMPLETED,
            lanes.completions.flushed,
        )
    finally:
        lanes.stop()
        keeper.stop()
    assert queues.get_job(bounced).status is JobStatus.DEAD
    samples = parse(generate_latest(metrics.registry).decode())
    jobs = "connector_sync_worker_attempt_seconds_count"
    assert of(samples, jobs, kind="job", scope="mail", outcome="completed") == 1
    assert of(samples, jobs, kind="job", scope="mail", outcome="dead") == 1
    claims = "connector_sync_worker_claim_seconds_count"
    found = sum(
        v for (n, labels), v in samples.items() if n == claims and ("scope", "mail") in labels
    )
    assert found == lanes.claims


def test_an_attempt_is_counted_once_per_job_in_the_bucket_of_its_duration() -> None:
    """A batch's attempt is one observation per job it held, each in the first bucket whose
    bound is at or above its duration, as a Prometheus histogram counts."""
    metrics = WorkerMetrics()
    metrics.attempt_ended("job", "mail", [COMPLETE, COMPLETE, DEAD], 0.5)
    metrics.attempt_ended("job", "mail", [COMPLETE], 4.0)
    metrics.attempt_ended("job", "mail", [], 0.05)  # the attempt raised
    samples = parse(generate_latest(metrics.registry).decode())
    bucket = "connector_sync_worker_attempt_seconds_bucket"
    completed = {"kind": "job", "scope": "mail", "outcome": "completed"}
    by_bound = {le: of(samples, bucket, **completed, le=le) for le in ("0.1", "0.5", "1.0", "5.0")}
    assert by_bound == {"0.1": 0, "0.5": 2, "1.0": 2, "5.0": 3}
    assert of(samples, bucket, **completed, le="+Inf") == 3
    assert of(samples, "connector_sync_worker_attempt_seconds_count", **completed) == 3
    assert of(samples, "connector_sync_worker_attempt_seconds_sum", **completed) == 5.0
    dead = {"kind": "job", "scope": "mail", "outcome": "dead"}
    assert of(samples, "connector_sync_worker_attempt_seconds_count", **dead) == 1
    error = {"kind": "job", "scope": "mail", "outcome": "error"}
    assert of(samples, bucket, **error, le="0.1") == 1
