"""The ``connector-sync`` command line: a thin layer over the Python API (``sync.api.Engine``).

It never runs SQL itself. Output is for people by default and one JSON document on stdout with
``--json``. A user's mistake (an unknown id, bad JSON, an unreachable or unmigrated database)
is one line on stderr and exit code 2; a sync that ends badly under ``sync --wait`` exits 1.
With ``DATABASE_URL`` unset every command uses the embedded Postgres under
``$CONNECTOR_SYNC_HOME``, migrated on first use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import psycopg
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

import connectors
from sync.api import Engine
from sync.db import connect, describe, first_line
from sync.embedded import data_dir, embedded_url
from sync.errors import SyncError
from sync.models import Run, WorkerInfo
from sync.progress import describe as describe_where
from sync.retry_policy import ordinal
from sync.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")

USER_ERROR = 2
RUN_FAILED = 1
STALE_HEARTBEATS = 3  # a worker silent for this many heartbeat intervals is stale
RUN_STATUSES = ("waiting", "queued", "running", "succeeded", "partial", "failed", "cancelled")

app = typer.Typer(
    name="connector-sync",
    help="Keep third-party SaaS data synced into your Postgres, with Postgres as the queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
workspaces_app = typer.Typer(help="Workspaces: the tenants connections belong to.")
connections_app = typer.Typer(help="Connections: one provider account synced into Postgres.")
runs_app = typer.Typer(help="Runs: syncs and purges, their attempts and results.")
app.add_typer(workspaces_app, name="workspaces", no_args_is_help=True)
app.add_typer(connections_app, name="connections", no_args_is_help=True)
app.add_typer(runs_app, name="runs", no_args_is_help=True)

JsonOption = typer.Option(False, "--json", help="Print one JSON document for scripts.")


def _out() -> Console:
    # Not a terminal (a pipe, a test): a wide console so tables are not folded to 80 columns.
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    return console


# -- errors: one line, exit 2 ------------------------------------------------------------------


def fail(message: str, code: int = USER_ERROR) -> NoReturn:
    """Print one line on stderr and exit."""
    line = " ".join(str(message).split())
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def guarded(command: Callable[P, R]) -> Callable[P, R]:
    """Turns the errors a user can cause into one line and exit code 2, and says which
    database the command used once it succeeded."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = command(*args, **kwargs)
        except SyncError as exc:
            fail(str(exc))
        except ValidationError as exc:  # a setting from the environment
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            fail(f"invalid setting ({problems})")
        except connectors.UnknownProvider as exc:
            fail(str(exc))
        except psycopg.OperationalError as exc:
            fail(f"the database connection failed: {first_line(exc)}")
        except psycopg.Error as exc:
            fail(f"the database refused the request: {first_line(exc)}", code=1)
        _session.announce()
        return result

    return wrapper


# -- the database ------------------------------------------------------------------------------


class _Session:
    """Which database this command uses, said once on stderr."""

    def __init__(self) -> None:
        self.where: str | None = None
        self._announced = False

    def announce(self) -> None:
        if self.where and not self._announced:
            self._announced = True
            print(f"database: {self.where}", file=sys.stderr, flush=True)


_session = _Session()


def load_settings(**overrides: Any) -> Settings:
    return Settings(**overrides)


def resolve_database(settings: Settings) -> tuple[str, bool]:
    """The URL to use and whether it is the embedded Postgres (started if need be)."""
    if settings.database_url:
        return settings.database_url, False
    return embedded_url(settings.home), True


@contextlib.contextmanager
def open_engine(
    settings: Settings | None = None, *, migrate_embedded: bool = True, check: bool = True
) -> Iterator[Engine]:
    """An Engine on DATABASE_URL or the embedded default. The embedded database is migrated on
    first use (it is this user's own); any other database must be migrated by an operator, so
    its schema is only checked."""
    settings = settings or load_settings()
    url, embedded = resolve_database(settings)
    if embedded:
        where = f"embedded Postgres under {data_dir(settings.home)}"
    else:
        where = f"{describe(url)} (DATABASE_URL)"
    where += f", schema {settings.schema_name}"
    connect(settings, url).close()  # fails fast, in one line, if it is unreachable
    engine = Engine(settings, database_url=url)
    try:
        if embedded and migrate_embedded:
            if engine.migrate():
                where += " (migrated just now)"
        elif check:
            engine.check_schema()
        _session.where = where
        yield engine
    finally:
        engine.close()


# -- input parsing (pure) ----------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """``15m``, ``1h``, ``1h30m``, ``45s``, ``1d`` (a bare number is seconds)."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = _DURATION.findall(value)
        if not parts or _DURATION.sub("", value).strip():
            raise ValueError(f"{text!r} is not a duration; write it like 30s, 15m, 1h or 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return timedelta(seconds=seconds)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def parse_json_object(value: str, option: str, *, secret: bool = False) -> dict[str, Any]:
    """A JSON object given inline, as ``@file`` or as ``@-`` (stdin). The message for bad input
    never quotes the input, which may be a secret."""
    text = value
    if value.startswith("@"):
        path = value[1:]
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"{option}: cannot read {path} ({exc.strerror})") from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{option} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(parsed, dict):
        kind = "a JSON " + type(parsed).__name__.replace("dict", "object")
        shown = "" if secret else f" ({kind})"
        raise ValueError(f'{option} must be a JSON object such as {{"key": "value"}}{shown}')
    return parsed


# -- output helpers ----------------------------------------------------------------------------


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    local = value.astimezone()
    if local.date() == datetime.now().astimezone().date():
        return local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d %H:%M")


def brief_error(error: dict[str, Any] | None, limit: int = 70) -> str:
    if not error:
        return ""
    text = f"{error.get('kind', 'error')}: {error.get('message', '')}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_duration(run: Run) -> float | None:
    if run.started_at is None:
        return None
    end = run.finished_at or datetime.now(UTC)
    return (end - run.started_at).total_seconds()


STATUS_STYLE = {
    "succeeded": "green",
    "partial": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "running": "cyan",
    "queued": "blue",
    "waiting": "blue",
    "active": "green",
    "paused": "yellow",
    "disconnected": "red",
    "deleting": "magenta",
    "alive": "green",
    "stale": "red",
    "stopped": "dim",
}


def styled(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def runs_table(runs: list[Run], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("run", "connection", "provider", "kind", "status", "trigger", "attempts"):
        table.add_column(column, no_wrap=True)
    for column in ("queued", "took", "records", "error"):
        table.add_column(column)
    for run in runs:
        table.add_row(
            f"#{run.id}",
            str(run.connection_id) if run.connection_id is not None else "(deleted)",
            run.provider,
            run.kind,
            styled(run.status),
            run.trigger,
            f"{run.attempts}/{run.max_attempts}",
            when(run.queued_at),
            format_duration(run_duration(run)),
            str(run.processed_units),
            brief_error(run.error),
        )
    return table


def worker_state(worker: WorkerInfo, settings: Settings) -> str:
    """alive, stale (no heartbeat for STALE_HEARTBEATS intervals: crashed or frozen) or
    stopped."""
    if worker.stopped_at is not None:
        return "stopped"
    limit = STALE_HEARTBEATS * settings.heartbeat_interval
    return "stale" if worker.since_heartbeat.total_seconds() > limit else "alive"


def workspace_id(engine: Engine, ref: str) -> int:
    return engine.workspace(ref).id


# -- schema ------------------------------------------------------------------------------------


@app.command()
@guarded
def migrate(as_json: bool = JsonOption) -> None:
    """Apply the pending schema migrations (run it after every upgrade, then `grant`)."""
    with open_engine(migrate_embedded=False, check=False) as engine:
        applied = engine.migrate()
        schema = engine.settings.schema_name
    if as_json:
        emit_json({"schema": schema, "applied": [m.filename for m in applied]})
    elif applied:
        for m in applied:
            _out().print(f"applied {m.filename}")
    else:
        _out().print(f"schema {schema} is up to date")


@app.command()
@guarded
def grant(
    role: str = typer.Argument(..., help="An existing database role (CREATE ROLE ... LOGIN)."),
) -> None:
    """Give a runtime ROLE the data rights the API and workers need, and no DDL rights."""
    with open_engine() as engine:
        engine.grant(role)
        schema = engine.settings.schema_name
    _out().print(f"granted {role} data rights on schema {schema} (no DDL)")


# -- workers -----------------------------------------------------------------------------------


@app.command()
@guarded
def worker(
    once: bool = typer.Option(
        False, "--once", help="Poll once (claim at most one run), then exit."
    ),
    worker_id: str | None = typer.Option(None, "--id", help="The worker's id (default: host-pid)."),
) -> None:
    """Run a worker: claim runs and execute them one at a time until SIGTERM or Ctrl-C.
    Run as many as you like, on any machines; SIGTERM hands the running run back at once."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per request is noise at INFO; the run's own log lines say what happened.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with open_engine() as engine:
        service = engine.worker(worker_id=worker_id, listen=not once)
        _session.announce()
        service.run(once=once)


@app.command("workers")
@guarded
def workers_command(as_json: bool = JsonOption) -> None:
    """Worker processes: alive, stale (no heartbeat lately: crashed or frozen) or stopped."""
    with open_engine() as engine:
        found = engine.workers()
        settings = engine.settings
    if as_json:
        emit_json([{**w.to_json(), "state": worker_state(w, settings)} for w in found])
        return
    table = Table()
    for column in ("worker", "state", "host", "pid", "version", "heartbeat", "running", "started"):
        table.add_column(column, no_wrap=True)
    for w in found:
        table.add_row(
            w.id,
            styled(worker_state(w, settings)),
            w.hostname,
            str(w.pid),
            w.version,
            f"{format_duration(w.since_heartbeat.total_seconds())} ago",
            f"#{w.current_run_id}" if w.current_run_id else "-",
            when(w.started_at),
        )
    _out().print(table if found else "no workers have run against this database yet")


# -- workspaces --------------------------------------------------------------------------------


@workspaces_app.command("create")
@guarded
def workspaces_create(name: str, as_json: bool = JsonOption) -> None:
    """Create a workspace."""
    with open_engine() as engine:
        ws = engine.create_workspace(name)
    if as_json:
        emit_json(ws.to_json())
    else:
        _out().print(f"workspace {ws.id} {ws.name!r} created")


@workspaces_app.command("list")
@guarded
def workspaces_list(as_json: bool = JsonOption) -> None:
    """List workspaces."""
    with open_engine() as engine:
        found = engine.workspaces()
    if as_json:
        emit_json([w.to_json() for w in found])
        return
    table = Table()
    for column in ("id", "name", "created"):
        table.add_column(column)
    for w in found:
        table.add_row(str(w.id), w.name, when(w.created_at))
    _out().print(table if found else "no workspaces yet: `connector-sync workspaces create NAME`")


# -- connections -------------------------------------------------------------------------------


@connections_app.command("create")
@guarded
def connections_create(
    workspace: str = typer.Option(..., "--workspace", "-w", help="Workspace id or name."),
    name: str = typer.Option(..., "--name", "-n", help="Unique within the workspace."),
    provider: str = typer.Option(..., "--provider", "-p", help="See `connector-sync providers`."),
    config: str = typer.Option("{}", "--config", help="JSON object, @file or @- (stdin)."),
    credentials: str | None = typer.Option(
        None, "--credentials", help="JSON object, @file or @- (stdin). Stored encrypted."
    ),
    every: str | None = typer.Option(None, "--every", help="Sync schedule: 15m, 1h, 1d..."),
    as_json: bool = JsonOption,
) -> None:
    """Create a connection: a provider account whose data is synced into this database."""
    try:
        config_value = parse_json_object(config, "--config")
        creds = (
            parse_json_object(credentials, "--credentials", secret=True) if credentials else None
        )
        schedule = parse_duration(every) if every else None
    except ValueError as exc:
        fail(str(exc))
    with open_engine() as engine:
        created = engine.create_connection(
            workspace_id(engine, workspace),
            name,
            provider,
            config=config_value,
            credentials=creds,
            schedule_every=schedule,
        )
    if as_json:
        emit_json(created.to_json())
    else:
        every_text = (
            f", synced every {format_duration(schedule.total_seconds())}" if schedule else ""
        )
        _out().print(
            f"connection {created.id} {created.name!r} ({created.provider}) created{every_text}"
        )


@connections_app.command("list")
@guarded
def connections_list(
    workspace: str | None = typer.Option(None, "--workspace", "-w", help="Workspace id or name."),
    as_json: bool = JsonOption,
) -> None:
    """List connections (credentials are never shown, only whether there are any)."""
    with open_engine() as engine:
        ws = workspace_id(engine, workspace) if workspace else None
        found = engine.connections(ws)
    if as_json:
        emit_json([c.to_json() for c in found])
        return
    table = Table()
    for column in ("id", "workspace", "name", "provider", "status", "every", "next run", "creds"):
        table.add_column(column, no_wrap=True)
    for c in found:
        table.add_row(
            str(c.id),
            str(c.workspace_id),
            c.name,
            c.provider,
            styled(c.status),
            format_duration(c.schedule_every.total_seconds()) if c.schedule_every else "-",
            when(c.next_run_at),
            "yes" if c.has_credentials else "no",
        )
    _out().print(table if found else "no connections yet: `connector-sync connections create`")


@connections_app.command("show")
@guarded
def connections_show(connection_id: int, as_json: bool = JsonOption) -> None:
    """A connection and its recent runs."""
    with open_engine() as engine:
        c = engine.connection(connection_id)
        recent = engine.runs(connection_id=connection_id, limit=10)
    if as_json:
        emit_json({**c.to_json(), "recent_runs": [r.to_json() for r in recent]})
        return
    out = _out()
    details = Table.grid(padding=(0, 2))
    details.add_row("connection", f"{c.id} {c.name!r}")
    details.add_row("workspace", str(c.workspace_id))
    details.add_row("provider", c.provider)
    details.add_row("status", styled(c.status))
    details.add_row("config", json.dumps(c.config))
    details.add_row("credentials", "stored, encrypted" if c.has_credentials else "none")
    if c.schedule_every:
        details.add_row("every", format_duration(c.schedule_every.total_seconds()))
        details.add_row("next run", when(c.next_run_at))
    details.add_row("created", when(c.created_at))
    out.print(details)
    if recent:
        out.print(runs_table(recent, title="recent runs"))


def _set_status(action: Callable[[Engine, int], Any], connection_id: int, verb: str) -> None:
    with open_engine() as engine:
        c = action(engine, connection_id)
    _out().print(f"connection {c.id} {verb} (status {c.status})")


@connections_app.command("pause")
@guarded
def connections_pause(connection_id: int) -> None:
    """Pause a connection: no scheduled or manual syncs until it is resumed."""
    _set_status(Engine.pause, connection_id, "paused")


@connections_app.command("resume")
@guarded
def connections_resume(connection_id: int) -> None:
    """Resume a paused connection (its schedule restarts from now)."""
    _set_status(Engine.resume, connection_id, "resumed")


@connections_app.command("delete")
@guarded
def connections_delete(connection_id: int, as_json: bool = JsonOption) -> None:
    """Delete a connection: its queued sync is cancelled and a purge run deletes its records
    (behind a sync that is still running). Run history is kept."""
    with open_engine() as engine:
        purge = engine.delete_connection(connection_id)
    if as_json:
        emit_json(purge.to_json())
        return
    behind = " behind the sync still running" if purge.status == "waiting" else ""
    _out().print(
        f"connection {connection_id} is being deleted: purge run #{purge.id} is "
        f"{purge.status}{behind}"
    )


# -- sync and runs -----------------------------------------------------------------------------


@app.command("sync")
@guarded
def sync_command(
    connection_id: int = typer.Argument(..., metavar="CONNECTION"),
    wait: bool = typer.Option(False, "--wait", help="Follow the run live until it ends."),
    as_json: bool = JsonOption,
) -> None:
    """Queue a sync of CONNECTION now (or show the one already queued or running)."""
    with open_engine() as engine:
        run = engine.sync(connection_id)
        if wait:
            _session.announce()
            try:
                run = follow_run(engine, run, live=not as_json)
            except KeyboardInterrupt:
                print(
                    f"stopped following run #{run.id}; it goes on (`connector-sync runs cancel "
                    f"{run.id}` stops it)",
                    file=sys.stderr,
                )
                raise typer.Exit(130) from None
    if as_json:
        emit_json(run.to_json())
    elif not wait:
        verb = "queued" if run.status == "queued" and run.attempts == 0 else "already " + run.status
        _out().print(f"run #{run.id} {verb} for connection {connection_id}")
    if wait and run.status != "succeeded":
        _session.announce()
        raise typer.Exit(RUN_FAILED)


def table_count(provider: str) -> int | None:
    try:
        return len(connectors.get(provider).tables)
    except connectors.UnknownProvider:
        return None


def tables_done(run: Run) -> int:
    return sum(1 for r in run.results.values() if r.get("status") in ("succeeded", "failed"))


def describe_progress(run: Run, *, workers_alive: int | None, now: datetime) -> str:
    """One line about where a run is; pure, for the live view and its plain-text twin."""
    if run.status == "queued":
        if run.waits and run.waiting_until is not None and run.waiting_until > now:
            until = run.waiting_until.astimezone(UTC)
            clock = (
                f"{until:%H:%M}" if until - now < timedelta(hours=20) else f"{until:%b %d %H:%M}"
            )
            return f"waiting for {run.waiting_for} until {clock} UTC, {ordinal(run.waits)} wait"
        if run.attempts > 0 and run.queued_at > now:
            wait = (run.queued_at - now).total_seconds()
            why = brief_error(run.error, 60)
            return f"retrying in {wait:.0f}s (attempt {run.attempts + 1} of {run.max_attempts})" + (
                f" after {why}" if why else ""
            )
        if workers_alive == 0:
            return "queued; no worker is running: start one with `connector-sync worker`"
        return "queued, waiting for a worker"
    if run.status == "running":
        text = f"running attempt {run.attempts} of {run.max_attempts}"
        if run.cancel_requested_at is not None:
            text += ", cancel requested"
        where = describe_where(run.progress)
        return f"{text}: {where}" if where else text
    if run.status == "waiting":
        return "waiting behind the sync still running"
    return run.status + (f": {brief_error(run.error, 90)}" if run.error else "")


def follow_run(engine: Engine, run: Run, *, live: bool, interval: float = 0.5) -> Run:
    """Poll the run until it ends, showing tables done, records written, attempts and a
    countdown while a retry waits. Returns the final run."""
    total = table_count(run.provider)
    out = _out()
    progress = Progress(
        TextColumn("[bold]run #{task.fields[run_id]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]} · {task.fields[note]}"),
        console=out,
    )
    task = progress.add_task("sync", total=total, run_id=run.id, unit="tables", note="")
    last_line = ""
    interactive = live and out.is_terminal
    checked_workers_at = 0.0
    alive: int | None = None
    display = Live(progress, console=out, refresh_per_second=8) if interactive else None
    with display or contextlib.nullcontext():
        while True:
            run = engine.run(run.id)
            if time.monotonic() - checked_workers_at > 5:
                checked_workers_at = time.monotonic()
                alive = sum(worker_state(w, engine.settings) == "alive" for w in engine.workers())
            line = describe_progress(run, workers_alive=alive, now=datetime.now(UTC))
            # The bar follows the table being read when the provider said its size.
            at = run.progress or {}
            if run.status == "running" and at.get("total"):
                done, of, unit = at.get("records", 0), at["total"], f"{at['table']} records"
            else:
                done, of, unit = tables_done(run), total, f"tables · {run.processed_units} records"
            progress.update(task, completed=done, total=of, unit=unit, note=line)
            if live and not interactive and line != last_line:
                out.print(f"run #{run.id}: {line}")
            last_line = line
            if run.is_terminal:
                break
            time.sleep(interval)
    if live:
        print_results(out, run)
    return run


def print_results(out: Console, run: Run) -> None:
    if run.results:
        out.print(results_table(run))
    style = STATUS_STYLE.get(run.status, "")
    ended = Text(f"run #{run.id} {run.status}", style=style)
    ended.append(f" after {run.attempts} attempt(s), {run.processed_units} records written")
    out.print(ended)
    if run.error:
        out.print(Text(brief_error(run.error, 200)))


def results_table(run: Run) -> Table:
    table = Table(title="tables", title_justify="left")
    for column in ("table", "status", "upserted", "unchanged", "tombstoned", "error"):
        table.add_column(column)
    for name, r in sorted(run.results.items()):
        table.add_row(
            name,
            styled(str(r.get("status", "pending"))),
            str(r.get("upserted", 0)),
            str(r.get("unchanged", 0)),
            str(r.get("tombstoned", 0)),
            brief_error(r.get("error"), 80),
        )
    return table


@runs_app.command("list")
@guarded
def runs_list(
    connection: int | None = typer.Option(None, "--connection", "-c"),
    status: str | None = typer.Option(None, "--status", "-s", help="queued, running, failed..."),
    workspace: str | None = typer.Option(None, "--workspace", "-w", help="Workspace id or name."),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000),
    as_json: bool = JsonOption,
) -> None:
    """Recent runs, newest first."""
    if status is not None and status not in RUN_STATUSES:
        fail(f"--status must be one of {', '.join(RUN_STATUSES)}")
    with open_engine() as engine:
        ws = workspace_id(engine, workspace) if workspace else None
        found = engine.runs(connection_id=connection, status=status, workspace_id=ws, limit=limit)
    if as_json:
        emit_json([r.to_json() for r in found])
        return
    _out().print(runs_table(found) if found else "no runs")


@runs_app.command("show")
@guarded
def runs_show(run_id: int, as_json: bool = JsonOption) -> None:
    """A run: its state and lease, every attempt, and the per-table results."""
    with open_engine() as engine:
        run = engine.run(run_id)
        attempts = engine.attempts(run_id)
    if as_json:
        emit_json({**run.to_json(), "attempts": [a.to_json() for a in attempts]})
        return
    out = _out()
    details = Table.grid(padding=(0, 2))
    details.add_row("run", f"#{run.id} ({run.kind}, trigger {run.trigger})")
    details.add_row("connection", str(run.connection_id or "(deleted)"))
    details.add_row("provider", run.provider)
    details.add_row("status", styled(run.status))
    details.add_row("attempts", f"{run.attempts} of {run.max_attempts}")
    details.add_row("queued", when(run.queued_at))
    details.add_row("started", when(run.started_at))
    details.add_row("finished", when(run.finished_at))
    details.add_row("records", str(run.processed_units))
    if run.waits:
        details.add_row("waits", f"{run.waits} for {run.waiting_for}")
    if run.status == "running":
        details.add_row("lease owner", str(run.lease_owner))
        details.add_row("lease expires", when(run.lease_expires_at))
        details.add_row("worker", run.worker_id or "-")
    if run.cancel_requested_at:
        details.add_row("cancel requested", when(run.cancel_requested_at))
    if run.error:
        details.add_row("error", brief_error(run.error, 200))
    if not run.is_terminal:  # a finished run's status and error say it all
        details.add_row("now", describe_progress(run, workers_alive=None, now=datetime.now(UTC)))
    out.print(details)
    if attempts:
        table = Table(title="attempts", title_justify="left")
        for column in ("#", "worker", "started", "took", "outcome", "error"):
            table.add_column(column)
        for a in attempts:
            took = (a.finished_at - a.started_at).total_seconds() if a.finished_at else None
            table.add_row(
                str(a.attempt),
                a.worker_id,
                when(a.started_at),
                format_duration(took),
                styled(a.outcome or "running"),
                brief_error(a.error, 80),
            )
        out.print(table)
    if run.results:
        out.print(results_table(run))


@runs_app.command("cancel")
@guarded
def runs_cancel(run_id: int, as_json: bool = JsonOption) -> None:
    """Cancel a queued run at once, or ask a running one to stop (it keeps its results)."""
    with open_engine() as engine:
        run = engine.cancel_run(run_id)
    if as_json:
        emit_json(run.to_json())
    elif run.status == "cancelled":
        _out().print(f"run #{run.id} cancelled")
    else:
        _out().print(f"run #{run.id} is running: its worker was asked to stop it")


@runs_app.command("retry")
@guarded
def runs_retry(run_id: int, as_json: bool = JsonOption) -> None:
    """Put a failed (dead-lettered) run back in the queue with a fresh set of attempts."""
    with open_engine() as engine:
        run = engine.retry_run(run_id)
    if as_json:
        emit_json(run.to_json())
    else:
        _out().print(f"run #{run.id} queued again ({run.max_attempts - run.attempts} attempts)")


# -- providers and the demo ----------------------------------------------------------------------


@app.command()
@guarded
def providers(as_json: bool = JsonOption) -> None:
    """The installed connectors: provider names, tables and config fields."""
    found = connectors.providers()
    described: list[dict[str, Any]] = [
        {
            "provider": name,
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "tables": [{"name": t.name, "mode": t.mode.value} for t in cls.tables],
            "config": sorted(cls.config_model.model_fields),
        }
        for name, cls in found.items()
    ]
    if as_json:
        emit_json(described)
        return
    table = Table()
    for column in ("provider", "tables", "config", "class"):
        table.add_column(column)
    for d in described:
        table.add_row(
            d["provider"],
            ", ".join(f"{t['name']} ({t['mode']})" for t in d["tables"]),
            ", ".join(d["config"]) or "-",
            d["class"],
        )
    _out().print(table)


@app.command()
@guarded
def demo(
    schema: str | None = typer.Option(
        None,
        "--schema",
        help="Schema to use (default: the usual one on the embedded Postgres, "
        "connector_sync_demo on DATABASE_URL).",
    ),
) -> None:
    """The one-minute demo: a simulated provider, two workers, and everything the queue does."""
    from sync.demo import run_demo

    settings = load_settings()
    if schema is None and settings.database_url:
        schema = "connector_sync_demo"
    if schema is not None:
        settings = load_settings(schema_name=schema)
    ok = run_demo(settings, console=_out())
    if not ok:
        raise typer.Exit(RUN_FAILED)


# -- the operator web page ----------------------------------------------------------------------


@app.command("ui")
@guarded
def ui_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port (0: any free one)."),
    read_only: bool = typer.Option(
        False, "--read-only", help="Show everything; refuse every action."
    ),
    auth_header: str | None = typer.Option(
        None,
        "--auth-header",
        help="A header naming the user, set by a reverse proxy you trust "
        "(CONNECTOR_SYNC_UI_AUTH_HEADER).",
    ),
) -> None:
    """Serve the operator web page and /metrics. Only on a loopback address unless
    CONNECTOR_SYNC_UI_TOKEN or --auth-header says who may use it."""
    from dataclasses import replace

    from sync.ui import UiOptions, serve

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = load_settings()
    token = settings.ui_token.get_secret_value() if settings.ui_token else None
    options = UiOptions(
        read_only=read_only,
        token=token or None,
        auth_header=auth_header or settings.ui_auth_header or None,
    )
    options.access.check(host)  # before touching the database
    with open_engine(settings) as engine:
        database = _session.where or describe(engine.url)
        _session.announce()

        def ready(url: str) -> None:
            mode = " (read-only)" if read_only else ""
            print(f"serving the operator page on {url}{mode}", file=sys.stderr, flush=True)

        options = replace(options, database=database)
        serve(engine, options, host=host, port=port, on_ready=ready)


def main() -> None:
    app(prog_name="connector-sync")


if __name__ == "__main__":
    main()
