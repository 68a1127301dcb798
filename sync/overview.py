"""What operators look at, as the Python API returns it: a connection with its current and last
runs, the progress of a running run in words, and the figures ``/metrics`` exports from the
database. Plain frozen records, built from rows of the named statements ``connections_overview``
and ``metrics_snapshot``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sync.models import WorkerInfo


class WorkerState(StrEnum):
    ALIVE = "alive"
    STALE = "stale"  # no heartbeat lately and no stop recorded: crashed, frozen or cut off
    STOPPED = "stopped"


def worker_state(worker: WorkerInfo, stale_after: float) -> WorkerState:
    """alive, stale (no heartbeat for ``stale_after`` seconds, see ``Settings.stale_after``) or
    stopped."""
    if worker.stopped_at is not None:
        return WorkerState.STOPPED
    if worker.since_heartbeat > timedelta(seconds=stale_after):
        return WorkerState.STALE
    return WorkerState.ALIVE


@dataclass(frozen=True)
class RunBrief:
    """Enough of a run to link to it and say how it went."""

    id: int
    status: str
    finished_at: datetime | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class ConnectionOverview:
    """A connection (never its credentials) with the run it has in flight and its last
    finished one."""

    id: int
    workspace_id: int
    workspace_name: str
    name: str
    provider: str
    status: str
    schedule_every: timedelta | None
    next_run_at: datetime | None
    active_run: RunBrief | None
    last_run: RunBrief | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ConnectionOverview:
        active = None
        if row["active_run_id"] is not None:
            active = RunBrief(row["active_run_id"], row["active_run_status"])
        last = None
        if row["last_run_id"] is not None:
            last = RunBrief(
                row["last_run_id"],
                row["last_run_status"],
                row["last_run_finished_at"],
                row["last_run_error"],
            )
        return cls(
            id=row["id"],
            workspace_id=row["workspace_id"],
            workspace_name=row["workspace_name"],
            name=row["name"],
            provider=row["provider"],
            status=row["status"],
            schedule_every=row["schedule_every"],
            next_run_at=row["next_run_at"],
            active_run=active,
            last_run=last,
        )


@dataclass(frozen=True)
class RunCount:
    kind: str
    provider: str
    status: str
    count: int


@dataclass(frozen=True)
class RecordTotals:
    """Records written by the syncs of one provider that finished in the metrics window,
    summed over their per-table results."""

    provider: str
    upserted: int
    unchanged: int
    tombstoned: int


@dataclass(frozen=True)
class QueueFigures:
    due: int  # queued and due: a worker could claim it now
    delayed: int  # queued for later: a retry waiting out its backoff or a Retry-After
    waiting: int  # purges waiting behind a running sync
    oldest_due_seconds: float | None
    expired_leases: int  # running with a lapsed lease: the worker died or froze
    oldest_running_seconds: float | None


@dataclass(frozen=True)
class AppQueueFigures:
    """One application queue's jobs at the snapshot's instant."""

    name: str
    due: int  # queued or retrying and due: a lane could claim it now
    delayed: int  # queued or retrying for later (start_after, a retry's backoff)
    active: int  # an attempt runs
    dead: int  # dead letters waiting in this queue for a redrive
    oldest_due_seconds: float | None  # how long the oldest due job has waited


@dataclass(frozen=True)
class MetricsSnapshot:
    """The database's figures at one instant (one statement, one snapshot)."""

    window_seconds: float  # finished runs and their records count over this much past
    live: tuple[RunCount, ...]  # waiting, queued and running runs
    finished: tuple[RunCount, ...]  # runs that finished within the window
    dead_letters: tuple[RunCount, ...]  # failed runs (status "failed"), whenever they failed
    queue: QueueFigures
    records: tuple[RecordTotals, ...]
    workers: dict[WorkerState, int]
    app_queues: tuple[AppQueueFigures, ...] = ()

    @classmethod
    def from_row(cls, row: dict[str, Any], window_seconds: float) -> MetricsSnapshot:
        queue = row["queue"]
        return cls(
            window_seconds=window_seconds,
            live=tuple(RunCount(**r) for r in row["live"]),
            finished=tuple(RunCount(**r) for r in row["finished"]),
            dead_letters=tuple(RunCount(status="failed", **r) for r in row["dead"]),
            queue=QueueFigures(
                due=queue["due"],
                delayed=queue["delayed"],
                waiting=queue["waiting"],
                oldest_due_seconds=queue["oldest_due_seconds"],
                expired_leases=queue["expired_leases"],
                oldest_running_seconds=queue["oldest_running_seconds"],
            ),
            records=tuple(RecordTotals(**r) for r in row["records"]),
            workers={state: int(row["workers"].get(state.value, 0)) for state in WorkerState},
            app_queues=tuple(AppQueueFigures(**q) for q in row.get("app_queues") or ()),
        )


def describe_progress(progress: Mapping[str, Any] | None) -> str:
    """The progress of a running run in words (pure): "table 2 of 3 (issues, octocat/hello),
    page 7, 700 of 2,000 records" ("of about 2,000" when the provider's total is an estimate)."""
    if not progress or not progress.get("table"):
        return ""
    where = progress["table"]
    if progress.get("partition"):
        where += f", {progress['partition']}"
    text = f"table {progress.get('table_index', 0)} of {progress.get('tables', 0)} ({where})"
    if progress.get("page"):
        text += f", page {progress['page']}"
    records = int(progress.get("records") or 0)
    total = progress.get("total")
    if total:
        about = "about " if progress.get("total_estimated") else ""
        text += f", {records:,} of {about}{int(total):,} records"
    else:
        text += f", {records:,} records"
    return text
