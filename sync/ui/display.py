"""How the page writes times, durations, errors and progress: pure functions, used as template
filters and globals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import connectors
from sync.models import Run
from sync.vocabulary import JobError, RunKind, TableStatus

DONE_TABLE_STATUSES = frozenset({TableStatus.SUCCEEDED, TableStatus.FAILED, TableStatus.CANCELLED})


def timestamp(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(value: timedelta | float | None) -> str:
    if value is None:
        return "-"
    seconds = max(value.total_seconds() if isinstance(value, timedelta) else value, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m" + (f"{secs:02d}s" if secs else "")
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h" + (f"{minutes:02d}m" if minutes else "")
    return f"{hours // 24}d" + (f"{hours % 24:02d}h" if hours % 24 else "")


def relative(value: datetime | None, now: datetime) -> str:
    """``12s ago`` or ``in 4m``."""
    if value is None:
        return "-"
    delta = (value - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def error_headline(error: JobError | Mapping[str, Any] | None) -> str:
    """The first line of an error, for lists; the run's page shows it whole."""
    if not error:
        return ""
    if isinstance(error, JobError):
        error = error.to_json()
    message = str(error.get("message", "")).strip()
    return f"{error.get('kind', 'error')}: {message.splitlines()[0] if message else ''}"


def error_details(error: JobError | Mapping[str, Any] | None) -> str:
    """Everything an error carries besides its kind and message, as JSON; empty if nothing."""
    if not error:
        return ""
    if isinstance(error, JobError):
        error = error.to_json()
    rest = {k: v for k, v in error.items() if k not in ("kind", "message") and v is not None}
    return json.dumps(rest, indent=2, sort_keys=True, default=str) if rest else ""


@dataclass(frozen=True)
class Progress:
    processed: int
    total: int | None
    tables_done: int
    tables_total: int | None

    @property
    def percent(self) -> int | None:
        if not self.total:
            return None
        return min(100, round(100 * self.processed / self.total))


def progress(run: Run) -> Progress:
    try:
        tables_total: int | None = len(connectors.get(run.provider).tables)
    except connectors.UnknownProvider:
        tables_total = None
    done = sum(1 for r in run.results.values() if r.get("status") in DONE_TABLE_STATUSES)
    if run.kind == RunKind.PURGE:
        tables_total = None
    return Progress(run.processed_units, run.total_units, done, tables_total)
