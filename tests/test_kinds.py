"""One job machinery: every kind of leased work (sync runs, application jobs, ingestions, and a
kind an application adds) runs through the worker's one executor, in a slot of its own, with a
lease, a log, a span and metrics under the same names with a ``kind`` label; a long ingestion
in its lane slot holds up no sync."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from sync import Engine
from sync.jobs import registry
from sync.queues import Abort, Job, JobStatus, queue_spec
from sync.queues.kind import QueueJobs
from tests.conftest import make_settings
from tests.ingestion_support import CountingEmbedder, write_text
from tests.test_sync_flow import items, new_dataset
from tests.test_tracing import spans  # noqa: F401 - the span exporter fixture
from tests.test_worker_metrics import parse
from tests.waiting import poll_until, until
from tests.webhooks import kind as webhooks

RECEIVER = "https://hooks.example.test/deliveries"


@pytest.fixture
def webhook_kind() -> Iterator[None]:
    registry.register("webhook", webhooks.slots)
    try:
        yield
    finally:
        registry.unregister("webhook")


def attempts_by(engine_metrics: Any) -> dict[tuple[str, str, str], float]:
    """The attempts a worker timed, by kind, scope and outcome."""
    samples = parse(generate_latest(engine_metrics.registry).decode())
    return {
        (labels["kind"], labels["scope"], labels["outcome"]): value
        for (name, pairs), value in samples.items()
        if name == "connector_sync_worker_attempt_seconds_count"
        for labels in [dict(pairs)]
    }


def test_a_kind_an_application_adds_runs_on_the_one_machinery(
    engine: Engine,
    webhook_kind: None,
    respx_mock: respx.MockRouter,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    answers = iter([httpx.Response(200), httpx.Response(503), httpx.Response(204)])
    received = respx_mock.post(RECEIVER).mock(side_effect=lambda request: next(answers))
    first = webhooks.enqueue(engine.pool, RECEIVER, {"event": "created"})
    second = webhooks.enqueue(engine.pool, RECEIVER, {"event": "updated"})
    worker = engine.worker(listen=False)
    try:
        assert worker.poll()  # one delivery per poll: the first is delivered
        assert worker.poll()  # the second meets a 503: requeued, with the one backoff
        with engine.pool.connection() as conn:
            conn.execute("UPDATE webhook_deliveries SET due_at = now()")  # its time comes
        assert worker.poll()
        assert not worker.poll()  # nothing left
    finally:
        worker.close()

    with engine.pool.connection() as conn:
        rows = conn.execute(
            "SELECT id, status, attempts, lease_owner FROM webhook_deliveries ORDER BY id"
        ).fetchall()
    assert [(r["id"], r["status"], r["attempts"]) for r in rows] == [
        (first, "delivered", 1),
        (second, "delivered", 2),
    ]
    assert all(r["lease_owner"] is None for r in rows)
    assert received.call_count == 3
    assert attempts_by(worker.metrics) == {
        ("webhook", "webhooks", "delivered"): 2,
        ("webhook", "webhooks", "requeue"): 1,
    }
    named = [s for s in spans.get_finished_spans() if s.name == "connector_sync.webhook"]
    assert len(named) == 3
    assert {dict(s.attributes or {})["connector_sync.delivery_id"] for s in named} == {
        first,
        second,
    }


def test_every_kind_has_its_span_and_its_metrics_under_the_same_names(
    schema: str,
    tmp_path: Path,
    spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    settings = make_settings(schema, lanes="mail=1")
    with Engine(settings, pool_size=6) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        key, _ = new_dataset(items=items(1, 2))
        connection = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        engine.queues.declare_queue(queue_spec("mail"))
        engine.queues.register("mail", lambda job, abort: None)
        sent = engine.queues.send("mail", {"to": "ops@example.test"})
        ingestion = engine.ingest(write_text(tmp_path / "notes.txt", paragraphs=2), ws.id)
        run = engine.sync(connection.id)
        worker = engine.worker(listen=False)
        try:
            assert worker.poll()  # a unit of each slot: the run, the job, the ingestion
            kind = worker.slot("job").kind
            assert isinstance(kind, QueueJobs)
            until(
                lambda: engine.queues.get_job(sent).status is JobStatus.COMPLETED,
                kind.completions.flushed,
            )
        finally:
            worker.close()
        assert engine.run(run.id).status == "succeeded"
        assert engine.ingestion(ingestion.id).status == "ready"
        timed = attempts_by(worker.metrics)
    assert timed == {
        ("run", "memory", "succeeded"): 1,
        ("job", "mail", "completed"): 1,
        ("ingestion", "local", "ready"): 1,
    }
    names = {s.name for s in spans.get_finished_spans()}
    assert {"connector_sync.run", "connector_sync.job", "connector_sync.ingestion"} <= names


def test_a_long_ingestion_holds_up_no_sync(schema: str, tmp_path: Path) -> None:
    settings = make_settings(schema, poll_interval=0.05)
    with Engine(settings, pool_size=6) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        key, _ = new_dataset(items=items(1, 2, 3))
        connection = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        ingestion = engine.ingest(write_text(tmp_path / "long.txt", paragraphs=40), ws.id)
        inside, release = threading.Event(), threading.Event()

        def hold(batch: int) -> None:
            inside.set()
            assert release.wait(60)

        worker = engine.worker(listen=False)
        worker.slot("ingestion").kind.embedder = CountingEmbedder(before=hold)
        loop = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        loop.start()
        try:
            assert inside.wait(60)  # the ingestion is in its lane, embedding
            run = engine.sync(connection.id)
            poll_until(lambda: engine.run(run.id).is_terminal)
            assert engine.run(run.id).status == "succeeded"
            assert engine.ingestion(ingestion.id).status == "running"  # still inside
        finally:
            release.set()
            worker.stop()
            loop.join(60)
        poll_until(lambda: engine.ingestion(ingestion.id).status in ("ready", "queued"))


def test_a_job_handler_sees_the_abort_signal_of_its_attempt(engine: Engine) -> None:
    """A cancel reaches a running application job through the keeper, as any kind's would."""
    seen: list[bool] = []
    inside = threading.Event()

    def handler(job: Job, abort: Abort) -> None:
        inside.set()
        seen.append(abort.wait(60))

    settings = engine.settings.model_copy(update={"lanes": "slow=1", "control_interval": 0.05})
    with Engine(settings, pool_size=4) as configured:
        configured.queues.declare_queue(queue_spec("slow"))
        configured.queues.register("slow", handler)
        job = configured.queues.send("slow", {})
        worker = configured.worker(listen=False)
        polling = threading.Thread(target=worker.poll)
        polling.start()
        try:
            assert inside.wait(60)
            configured.queues.cancel_job(job)
            polling.join(60)
        finally:
            worker.close()
        assert seen == [True]
        assert configured.queues.get_job(job).status is JobStatus.CANCELLED
