"""A sync in a process where only the OpenTelemetry API can be imported, as in an application
that installs no SDK: `python -m tests.tracing_without_sdk SCHEMA`. It records every span the
engine and the HTTP client start, runs a sync of the simulated provider, and prints what it saw
as one JSON line for tests/test_tracing.py."""

from __future__ import annotations

import contextlib
import importlib.abc
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any


class NoSdk(importlib.abc.MetaPathFinder):
    """Makes ``opentelemetry.sdk`` unimportable, though the test extra installs it here."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> None:
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoSdk())

from opentelemetry import trace  # noqa: E402 - after the SDK is made unimportable

from connectors import http  # noqa: E402
from connectors.simulated.server import Simulation, start_server  # noqa: E402
from sync import Engine  # noqa: E402
from sync.base import tracing  # noqa: E402
from sync.testing import run_sync  # noqa: E402
from tests.conftest import make_settings  # noqa: E402

STARTED: list[trace.Span] = []


def watch(tracer: Any) -> None:
    """Keep every span ``tracer`` starts, whichever way it is started."""
    start_span = tracer.start_span
    start_as_current_span = tracer.start_as_current_span

    def watched_start_span(*args: Any, **kwargs: Any) -> trace.Span:
        span = start_span(*args, **kwargs)
        STARTED.append(span)
        return span

    @contextlib.contextmanager
    def watched_start_as_current_span(*args: Any, **kwargs: Any) -> Iterator[trace.Span]:
        with start_as_current_span(*args, **kwargs) as span:
            STARTED.append(span)
            yield span

    tracer.start_span = watched_start_span
    tracer.start_as_current_span = watched_start_as_current_span


def main() -> None:
    schema = sys.argv[1]
    watch(tracing.tracer)
    watch(http._tracer)
    simulation = Simulation()
    simulation.add_tenant("acme", size=25, seed=7)
    url, stop = start_server(simulation)
    try:
        with Engine(make_settings(schema)) as engine:
            engine.migrate()
            ws = engine.create_workspace("acme")
            connection = engine.create_connection(
                ws.id,
                "c",
                "simulated",
                config={"base_url": url, "tenant": "acme", "page_size": 10},
                credentials={"token": "sim-acme"},
            )
            run = run_sync(engine, connection.id)
    finally:
        stop()
    print(
        json.dumps(
            {
                "status": run.status,
                "provider": type(trace.get_tracer_provider()).__name__,
                "sdk_loaded": any(m.startswith("opentelemetry.sdk") for m in sys.modules),
                "spans": len(STARTED),
                "recording": sum(span.is_recording() for span in STARTED),
                "valid_contexts": sum(span.get_span_context().is_valid for span in STARTED),
                "span_types": sorted({type(span).__name__ for span in STARTED}),
            }
        )
    )


if __name__ == "__main__":
    main()
