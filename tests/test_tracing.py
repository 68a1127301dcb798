"""Traces through the OpenTelemetry API, recorded by the SDK's in-memory exporter: a sync's
attempt is a span, each table a span inside it, each provider HTTP request a client span inside
its table's, with no credential and no query string in any attribute. Without an SDK, in a process
that cannot import one, the same code records and exports nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.testing import run_sync
from tests.conftest import make_settings

TOKEN = "sim-acme"


class Switch(SpanProcessor):
    """Forwards ended spans to the exporter only while a test of this module records: the
    process's tracer provider can be set once, and other tests run in this process too."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.inner = SimpleSpanProcessor(exporter)
        self.on = threading.Event()

    def on_start(self, span: object, parent_context: context.Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.on.is_set():
            self.inner.on_end(span)


_EXPORTER = InMemorySpanExporter()
_SWITCH = Switch(_EXPORTER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SWITCH)
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _SWITCH.on.set()
    try:
        yield _EXPORTER
    finally:
        _SWITCH.on.clear()
        _EXPORTER.clear()


@pytest.fixture
def server() -> Iterator[str]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=25, seed=7)
    url, stop = start_server(simulation)
    yield url
    stop()


def test_a_sync_is_a_span_with_a_span_per_table_and_per_request(
    schema: str, server: str, spans: InMemorySpanExporter
) -> None:
    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        config = {"base_url": server, "tenant": "acme", "page_size": 10}
        connection = engine.create_connection(
            ws.id, "c", "simulated", config=config, credentials={"token": TOKEN}
        )
        run = run_sync(engine, connection.id)
    assert run.status == "succeeded"
    found = spans.get_finished_spans()
    runs = [s for s in found if s.name == "connector_sync.run"]
    assert len(runs) == 1
    top = runs[0]
    assert top.attributes is not None
    assert top.attributes["connector_sync.run_id"] == run.id
    assert top.attributes["connector_sync.kind"] == "run"
    assert top.attributes["connector_sync.scope"] == "simulated"
    assert top.attributes["connector_sync.outcome"] == "succeeded"
    assert top.status.status_code is not StatusCode.ERROR

    tables = [s for s in found if s.name == "connector_sync.table"]
    assert sorted(str((s.attributes or {})["connector_sync.table"]) for s in tables) == sorted(
        run.results
    )
    for table in tables:
        assert table.parent is not None and table.parent.span_id == top.context.span_id
        assert table.context.trace_id == top.context.trace_id
        attrs = table.attributes or {}
        expected = run.results[str(attrs["connector_sync.table"])]
        assert attrs["connector_sync.upserted"] == expected["upserted"]
        assert attrs["connector_sync.status"] == "succeeded"

    requests = [s for s in found if s.kind is SpanKind.CLIENT]
    table_ids = {t.context.span_id for t in tables}
    assert len(requests) >= len(tables)
    for request in requests:
        attrs = request.attributes or {}
        assert request.name == "GET" and attrs["http.request.method"] == "GET"
        assert attrs["http.response.status_code"] == 200
        assert str(attrs["url.full"]).startswith(server) and "?" not in str(attrs["url.full"])
        assert request.parent is not None and request.parent.span_id in table_ids
    everything = repr([(s.name, dict(s.attributes or {}), s.events) for s in found])
    assert TOKEN not in everything


def test_a_failing_table_marks_its_span_and_the_runs(
    schema: str, spans: InMemorySpanExporter
) -> None:
    from connectors import PermanentError
    from tests.test_sync_flow import items, new_dataset

    with Engine(make_settings(schema)) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(1, 2))
        data.failures["items"] = (0, PermanentError("the provider refused"))
        data.failures["notes"] = (0, PermanentError("the provider refused"))
        ws = engine.create_workspace("acme")
        connection = engine.create_connection(ws.id, "m", "memory", config={"dataset": key})
        run = run_sync(engine, connection.id)
    assert run.status == "failed"
    found = spans.get_finished_spans()
    tables = [s for s in found if s.name == "connector_sync.table"]
    assert tables and all(s.status.status_code is StatusCode.ERROR for s in tables)
    assert all("the provider refused" in (s.status.description or "") for s in tables)
    attempts = [s for s in found if s.name == "connector_sync.run"]
    assert attempts
    assert attempts[-1].status.status_code is StatusCode.ERROR
    assert (attempts[-1].attributes or {})["connector_sync.outcome"] == "failed"


@pytest.mark.slow
def test_without_an_sdk_spans_record_nothing_and_nothing_is_exported(schema: str) -> None:
    """A process that cannot import the SDK runs a sync: every span the engine and the HTTP
    client start is the API's non-recording one, under the API's default proxy provider. The
    exporter settings an SDK would read point at a socket here; nothing connects to it."""
    collector = socket.create_server(("127.0.0.1", 0))
    port = collector.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tests.tracing_without_sdk", schema],
            cwd=Path(__file__).parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        # The process has ended: a connection it made would be waiting in the backlog.
        collector.setblocking(False)
        with pytest.raises(BlockingIOError):
            collector.accept()
    finally:
        collector.close()
    assert seen["status"] == "succeeded"
    assert seen["provider"] == "ProxyTracerProvider" and not seen["sdk_loaded"]
    # The attempt, its tables and its HTTP requests each started a span...
    assert seen["spans"] >= 4
    # ...and none of them records, or has an id an exporter could send.
    assert seen["recording"] == 0 and seen["valid_contexts"] == 0
    assert seen["span_types"] == ["NonRecordingSpan"]
