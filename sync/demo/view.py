"""What the demo shows while it runs: an event line for every change of a run in the demo's
workspace and, on a terminal, a live table of the runs below them; waiting on a condition with
the demo's deadline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sync.api import Engine
from sync.models import Run
from sync.vocabulary import RunKind, RunStatus

DEADLINE = 55.0  # seconds: the demo gives up (and fails) past this


class DemoFailed(Exception):
    """The demo could not finish its script: a wait outlived the deadline or a worker exited."""


class View:
    """Follows the workspace's runs: prints an event line for every change and, on a terminal,
    keeps a live table of the runs below them."""

    def __init__(self, engine: Engine, workspace_id: int, names: dict[int, str], console: Console):
        self.engine = engine
        self.workspace_id = workspace_id
        self.names = names  # connection id -> name
        self.console = console
        self.started = time.monotonic()
        self._seen: dict[int, tuple[str, int]] = {}
        self._run_names: dict[int, str] = {}  # kept after a purge removes the connection
        self._runs: list[Run] = []
        self._live: Live | None = None

    @contextlib.contextmanager
    def showing(self) -> Iterator[None]:
        if self.console.is_terminal:
            with Live(self._render(), console=self.console, refresh_per_second=8) as live:
                self._live = live
                try:
                    yield
                finally:
                    self.refresh()
                    self._live = None
        else:
            yield

    def say(self, text: str, style: str = "") -> None:
        stamp = f"{time.monotonic() - self.started:5.1f}s"
        line = Text(f"{stamp}  ", style="dim")
        line.append(text, style=style)
        self.console.print(line)

    def step(self, text: str) -> None:
        self.say(text, style="bold")

    def refresh(self) -> None:
        self._runs = self.engine.runs(workspace_id=self.workspace_id, limit=200)
        for run in sorted(self._runs, key=lambda r: r.id):
            key = (run.status, run.attempts)
            if self._seen.get(run.id) != key:
                self._seen[run.id] = key
                self.say(self._event(run), style=_STYLE.get(run.status, ""))
        if self._live is not None:
            self._live.update(self._render())

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if predicate():
                return
            if time.monotonic() > deadline or time.monotonic() - self.started > DEADLINE:
                raise DemoFailed(f"timed out waiting for {what}")
            time.sleep(0.2)

    def _name(self, run: Run) -> str:
        if run.connection_id in self.names:
            self._run_names[run.id] = self.names[run.connection_id]
        return self._run_names.get(run.id, "(deleted)")

    def _label(self, run: Run) -> str:
        name = self._name(run)
        return f"{run.kind} #{run.id} of {name} ({run.provider})"

    def _event(self, run: Run) -> str:
        label = self._label(run)
        if run.status == RunStatus.QUEUED and run.attempts == 0 and not run.waits:
            return f"{label} queued"
        if run.status == RunStatus.QUEUED:
            wait = (run.queued_at - datetime.now(run.queued_at.tzinfo)).total_seconds()
            why = run.error.message if run.error else ""
            return f"{label} requeued, retry in {max(wait, 0):.1f}s: {why}"
        if run.status == RunStatus.WAITING:
            return f"{label} waiting behind the sync still running"
        if run.status == RunStatus.RUNNING:
            return f"{label} claimed by {run.worker_id} (attempt {run.attempts})"
        totals = run_totals(run)
        took = ""
        if run.started_at and run.finished_at:
            took = f" in {(run.finished_at - run.started_at).total_seconds():.1f}s"
        if run.kind == RunKind.PURGE:
            return f"{label} {run.status}{took}: {run.processed_units} records purged"
        return (
            f"{label} {run.status}{took}: {totals['upserted']} upserted, "
            f"{totals['unchanged']} unchanged, {totals['tombstoned']} tombstoned"
        )

    def _render(self) -> Table:
        table = Table(title="runs in the demo workspace", title_justify="left")
        for column in ("run", "connection", "provider", "kind", "status", "attempt", "records"):
            table.add_column(column, no_wrap=True)
        table.add_column("now")
        now = datetime.now().astimezone()
        for run in sorted(self._runs, key=lambda r: r.id):
            note = ""
            if run.status == RunStatus.QUEUED and run.attempts and run.queued_at > now:
                note = f"retry in {(run.queued_at - now).total_seconds():.1f}s (Retry-After)"
            elif run.status == RunStatus.RUNNING:
                note = f"on {run.worker_id}" + (
                    ", cancel requested" if run.cancel_requested_at else ""
                )
            elif run.status == RunStatus.WAITING:
                note = "purge draining behind the running sync"
            table.add_row(
                f"#{run.id}",
                self._name(run),
                run.provider,
                run.kind,
                Text(run.status, style=_STYLE.get(run.status, "")),
                f"{run.attempts}/{run.max_attempts}",
                str(run.processed_units),
                note,
            )
        return table


_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "partial": "yellow",
    "cancelled": "magenta",
    "running": "cyan",
    "queued": "blue",
    "waiting": "blue",
}


def run_totals(run: Run) -> dict[str, int]:
    """A run's records upserted, unchanged and tombstoned, summed over its tables."""
    totals = {"upserted": 0, "unchanged": 0, "tombstoned": 0}
    for result in run.results.values():
        for key in totals:
            totals[key] += int(result.get(key, 0))
    return totals
