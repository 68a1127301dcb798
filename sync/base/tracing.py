"""Traces through the OpenTelemetry API: a span per attempt of a run, one per table it reads
(and each provider HTTP request, from ``connectors.http``, is a span inside that table's).
Only the API is a dependency, so this is a no-op until the application installs an SDK and
sets a tracer provider (``opentelemetry.trace.set_tracer_provider``), which it may do after
importing this module. Attributes carry ids, kinds, providers, table names and counts: never a
credential, a config value or a record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Span, Status, StatusCode

# A proxy: it follows whatever tracer provider is set, also when it is set later.
tracer = trace.get_tracer("connector_sync")

Attributes = Mapping[str, str | int | float | bool]


@dataclass
class Open:
    """A span made current by :func:`begin`, ended by :func:`end` (for code whose body
    cannot sit under a ``with``)."""

    span: Span
    token: Any


def active() -> bool:
    """Whether an application has set a tracer provider: until it does, every span is a no-op,
    and a caller running many short attempts skips making one (and its attributes)."""
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def begin(name: str, attributes: Attributes) -> Open:
    span = tracer.start_span(name, attributes=dict(attributes))
    return Open(span, context.attach(trace.set_span_in_context(span)))


def end(opened: Open, attributes: Attributes, *, error: str | None = None) -> None:
    """Set the span's last attributes, mark it failed if ``error``, and end it."""
    opened.span.set_attributes(dict(attributes))
    if error is not None:
        opened.span.set_status(Status(StatusCode.ERROR, error))
    context.detach(opened.token)
    opened.span.end()
