"""The ``connector-sync`` command line: a thin layer over the Python API (``sync.api.Engine``).

It never runs SQL itself. Output is for people by default, as wide as the terminal (or
``$COLUMNS``), and one JSON document on stdout with ``--json``. Every mistake, a usage error
included (an unknown id, bad JSON, a word where a number goes, an unreachable or unmigrated
database), is one line on stderr and exit code 2; a sync that ends badly under ``sync --wait``
exits 1; Ctrl-C exits 130 without a traceback. Each command says on stderr which database it
used, also when it fails. With ``DATABASE_URL`` unset every command uses the embedded Postgres
under ``$CONNECTOR_SYNC_HOME`` (the user's data directory by default), migrated on first use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import psycopg
import typer
import typer.core
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

import connectors
from sync import overview
from sync.api import Engine, describe_database
from sync.catalog import describe_providers
from sync.console import (
    STATUS_STYLE,
    Cell,
    Col,
    console,
    details,
    error_text,
    fitted_table,
    format_duration,
    format_every,
    styled,
    when,
)
from sync.database_url import describe, is_valid, scrub
from sync.db import connect, first_line
from sync.embedded import data_dir, embedded_url, server_status, stop_server
from sync.errors import SyncError
from sync.models import Attempt, Connection, Record, Run, WorkerInfo
from sync.names import check_name
from sync.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")

USER_ERROR = 2
RUN_FAILED = 1
INTERRUPTED = 130
RUN_STATUSES = ("waiting", "queued", "running", "succeeded", "partial", "failed", "cancelled")


def _without_flag_placeholders(params: Sequence[Any]) -> None:
    # typer shows a type placeholder such as `<bool>` after every flag, `--help` included, and
    # `<str>` or `<int>` after an option or argument that names no placeholder of its own:
    # flags get none, the others their name (`--host HOST`, `{RUN}`).
    for param in params:
        if param.metavar is not None:
            continue
        param.metavar = "" if getattr(param, "is_flag", False) else param.name.upper()


class _Group(typer.core.TyperGroup):
    """Help that shows flags without a type placeholder, for every command of the group."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _without_flag_placeholders(params)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _without_flag_placeholders(command.get_params(ctx))
        return command


def _group(help_text: str) -> typer.Typer:
    return typer.Typer(help=help_text, cls=_Group, no_args_is_help=True)


app = typer.Typer(
    name="connector-sync",
    help="Keep third-party SaaS data synced into your Postgres, with Postgres as the queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)
workspaces_app = _group("Workspaces: the tenants connections belong to.")
connections_app = _group("Connections: one provider account synced into Postgres.")
runs_app = _group("Runs: syncs and purges, their attempts and results.")
records_app = _group("Records: the rows synced from providers.")
secrets_app = _group("Secrets: the keys that encrypt connection credentials.")
db_app = _group("The embedded Postgres used when DATABASE_URL is unset.")
app.add_typer(workspaces_app, name="workspaces")
app.add_typer(connections_app, name="connections")
app.add_typer(runs_app, name="runs")
app.add_typer(records_app, name="records")
app.add_typer(secrets_app, name="secrets")
app.add_typer(db_app, name="db")

JsonOption = typer.Option(False, "--json", help="Print one JSON document for scripts.")
WorkspaceOption = typer.Option(
    None, "--workspace", "-w", metavar="WORKSPACE", help="Workspace id (digits) or name."
)


def ConnectionArg() -> Any:
    return typer.Argument(..., metavar="CONNECTION", min=1, help="A connection id.")


def RunArg() -> Any:
    return typer.Argument(..., metavar="RUN", min=1, help="A run id.")


def _out() -> Console:
    return console()


# -- errors: one line, exit 2 ------------------------------------------------------------------


def fail(message: str, code: int = USER_ERROR) -> NoReturn:
    """Print one line on stderr, naming the database the command used, and exit."""
    line = " ".join(scrub(str(message), _session.url).split())
    if _session.where and _session.target not in line:
        line += f" (database: {_session.where})"
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
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            raise typer.Exit(INTERRUPTED) from None
        _session.announce()
        return result

    return wrapper


# -- the database ------------------------------------------------------------------------------


class _Session:
    """Which database this command uses, said once on stderr (and in its error, if any)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.where: str | None = None  # the database and schema, for people
        self.target = ""  # the database alone: an error that names it needs no suffix
        self.url: str | None = None  # DATABASE_URL, whose secrets no message may show
        self._announced = False

    def use(self, settings: Settings, *, embedded: bool = False) -> None:
        url = None if embedded else settings.database_url
        self.url = settings.database_url
        if url and not is_valid(url):  # its error says what is wrong with it
            self.where = None
            return
        self.target = describe(url) if url else str(data_dir(settings.home))
        self.where = describe_database(settings.model_copy(update={"database_url": url}))

    def announce(self) -> None:
        if self.where and not self._announced:
            self._announced = True
            print(f"database: {self.where}", file=sys.stderr, flush=True)


_session = _Session()


def load_settings(**overrides: Any) -> Settings:
    settings = Settings(**overrides)
    _session.use(settings)
    return settings


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
    _session.use(settings)
    url, embedded = resolve_database(settings)
    connect(settings, url).close()  # fails fast, in one line, if it is unreachable
    engine = Engine(settings, database_url=url)
    try:
        if embedded and migrate_embedded:
            if engine.migrate() and _session.where:
                _session.where += " (migrated just now)"
        elif check:
            engine.check_schema()
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


def brief_error(error: dict[str, Any] | None, limit: int = 70) -> str:
    text = error_text(error)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_duration(run: Run) -> float | None:
    if run.started_at is None:
        return None
    end = run.finished_at or datetime.now(UTC)
    return (end - run.started_at).total_seconds()


def counts(results: dict[str, Any] | None) -> dict[str, int]:
    """Upserted, unchanged and tombstoned, summed over a run's (or an attempt's) tables."""
    totals = {"upserted": 0, "unchanged": 0, "tombstoned": 0}
    for result in (results or {}).values():
        for key in totals:
            totals[key] += int(result.get(key) or 0)
    return totals


def counts_text(results: dict[str, Any] | None) -> str:
    c = counts(results)
    return f"{c['upserted']} upserted, {c['unchanged']} unchanged, {c['tombstoned']} tombstoned"


def connection_ref(run: Run) -> str:
    if run.connection_id is not None:
        return str(run.connection_id)
    if run.deleted_connection_id is not None:
        return f"{run.deleted_connection_id} (deleted)"
    return "(deleted)"


def runs_table(runs: list[Run], width: int, title: str | None = None) -> Table:
    columns = [
        Col("run", key=True),
        Col("connection", keep=9),
        Col("provider", keep=7),
        Col("kind", keep=2),
        Col("status", key=True),
        Col("trigger", keep=0),
        Col("tries", keep=8, justify="right"),
        Col("queued", keep=4),
        Col("took", keep=3, justify="right"),
        Col("upserted", keep=6, justify="right"),
        Col("tombstoned", keep=5, justify="right"),
        Col("error", text="ellipsis"),
    ]
    rows: list[list[Cell]] = []
    for run in runs:
        c = counts(run.results)
        synced = run.kind == "sync"
        rows.append(
            [
                f"#{run.id}",
                connection_ref(run),
                run.provider,
                run.kind,
                styled(run.status),
                run.trigger,
                f"{run.attempts}/{run.max_attempts}",
                when(run.queued_at, seconds=False),
                format_duration(run_duration(run)),
                str(c["upserted"]) if synced else "-",
                str(c["tombstoned"]) if synced else "-",
                error_text(run.error, status=run.status),
            ]
        )
    return fitted_table(columns, rows, width, title=title)


def worker_state(worker: WorkerInfo, settings: Settings) -> str:
    """alive, stale (no heartbeat for three intervals: crashed or frozen) or stopped."""
    return str(overview.worker_state(worker, settings.heartbeat_interval))


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
    role: str = typer.Argument(
        ..., metavar="ROLE", help="An existing database role (CREATE ROLE ... LOGIN)."
    ),
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
    worker_id: str | None = typer.Option(
        None, "--id", metavar="ID", help="The worker's id (default: host-pid-random)."
    ),
) -> None:
    """Run a worker: claim runs and execute them one at a time until SIGTERM or Ctrl-C.
    Run as many as you like, on any machines; SIGTERM hands the running run back at once.
    It runs syncs of the providers installed when it starts (restart it after installing a
    connector package)."""
    if worker_id is not None:
        check_name(worker_id, "worker")
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
        logging.getLogger("sync.worker").info(
            "worker %s runs providers: %s", service.id, ", ".join(service.providers) or "none"
        )
        service.run(once=once)


@app.command("workers")
@guarded
def workers_command(as_json: bool = JsonOption) -> None:
    """Worker processes: alive, stale (no heartbeat lately: crashed or frozen) or stopped,
    what each runs, and queued runs no live worker can take."""
    with open_engine() as engine:
        found = engine.workers()
        orphans = [] if as_json else engine.queued_without_worker()
        settings = engine.settings
    if as_json:
        emit_json([{**w.to_json(), "state": worker_state(w, settings)} for w in found])
        return
    out = _out()
    if not found:
        out.print("no workers have run against this database yet")
    else:
        columns = [
            Col("worker", key=True),
            Col("state", key=True),
            Col("pid", key=True, justify="right"),
            Col("host", keep=6),
            Col("version", keep=1),
            Col("heartbeat", keep=5),
            Col("running", keep=7),
            Col("started", keep=2),
            Col("providers", text="fold", keep=3),
        ]
        rows: list[list[Cell]] = [
            [
                w.id,
                styled(worker_state(w, settings)),
                str(w.pid),
                w.hostname,
                w.version,
                f"{format_duration(w.since_heartbeat.total_seconds())} ago",
                f"#{w.current_run_id}" if w.current_run_id else "-",
                when(w.started_at, seconds=False),
                "any" if w.providers is None else ", ".join(w.providers) or "none",
            ]
            for w in found
        ]
        out.print(fitted_table(columns, rows, out.width))
    nobody = not any(worker_state(w, settings) == "alive" for w in found)
    for provider, runs, oldest in orphans:
        why = (
            "no worker is running: start one with `connector-sync worker`"
            if nobody
            else f"no live worker has the {provider} connector; start one where its package "
            "is installed"
        )
        out.print(
            Text(
                f"{runs} queued run(s) of provider {provider} (oldest #{oldest}) wait: {why}",
                style="yellow",
            )
        )


# -- workspaces --------------------------------------------------------------------------------


@workspaces_app.command("create")
@guarded
def workspaces_create(
    name: str = typer.Argument(..., metavar="NAME", help="Unique; not made of digits alone."),
    as_json: bool = JsonOption,
) -> None:
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
    """List workspaces (a deleted one stays listed until its connections are purged)."""
    with open_engine() as engine:
        found = engine.workspaces()
    if as_json:
        emit_json([w.to_json() for w in found])
        return
    out = _out()
    if not found:
        out.print("no workspaces yet: `connector-sync workspaces create NAME`")
        return
    columns = [
        Col("id", key=True, justify="right"),
        Col("name", text="fold"),
        Col("status", key=True),
        Col("connections", keep=2, justify="right"),
        Col("created", keep=1),
    ]
    rows: list[list[Cell]] = [
        [
            str(w.id),
            w.name,
            styled("deleting" if w.deleted_at else "active"),
            str(w.connections),
            when(w.created_at, seconds=False),
        ]
        for w in found
    ]
    out.print(fitted_table(columns, rows, out.width))


@workspaces_app.command("rename")
@guarded
def workspaces_rename(
    workspace: str = typer.Argument(..., metavar="WORKSPACE", help="Workspace id or name."),
    name: str = typer.Argument(..., metavar="NAME", help="The new name."),
    as_json: bool = JsonOption,
) -> None:
    """Rename a workspace."""
    with open_engine() as engine:
        ws = engine.rename_workspace(workspace, name)
    if as_json:
        emit_json(ws.to_json())
    else:
        _out().print(f"workspace {ws.id} renamed {ws.name!r}")


@workspaces_app.command("delete")
@guarded
def workspaces_delete(
    workspace: str = typer.Argument(..., metavar="WORKSPACE", help="Workspace id or name."),
    as_json: bool = JsonOption,
) -> None:
    """Delete a workspace: every connection in it is deleted (a purge run removes its records,
    behind a sync still running), and its name is free again. Run history is kept."""
    with open_engine() as engine:
        ws = engine.workspace(workspace)
        purges = engine.delete_workspace(ws.id)
    if as_json:
        emit_json({"workspace": ws.to_json(), "purges": [p.to_json() for p in purges]})
        return
    out = _out()
    if not purges:
        out.print(f"workspace {ws.id} {ws.name!r} deleted (it had no connections)")
        return
    runs = ", ".join(f"#{p.id}" for p in purges)
    out.print(
        f"workspace {ws.id} {ws.name!r} is being deleted: {len(purges)} connection(s) purged by "
        f"run(s) {runs}; a worker runs them (`connector-sync runs list -w {ws.id}`)"
    )


# -- connections -------------------------------------------------------------------------------


def _schedule_text(every: timedelta | None) -> str:
    return f", synced every {format_every(every.total_seconds())}" if every else ""


@connections_app.command("create")
@guarded
def connections_create(
    workspace: str = typer.Option(
        ..., "--workspace", "-w", metavar="WORKSPACE", help="Workspace id (digits) or name."
    ),
    name: str = typer.Option(
        ..., "--name", "-n", metavar="NAME", help="Unique within the workspace."
    ),
    provider: str = typer.Option(
        ..., "--provider", "-p", metavar="PROVIDER", help="See `connector-sync providers`."
    ),
    config: str = typer.Option(
        "{}", "--config", metavar="JSON", help="JSON object, @file or @- (stdin)."
    ),
    credentials: str | None = typer.Option(
        None,
        "--credentials",
        metavar="JSON",
        help="JSON object, @file or @- (stdin). Stored encrypted, never printed.",
    ),
    every: str | None = typer.Option(
        None, "--every", metavar="DURATION", help="Sync schedule: 15m, 1h, 1d..."
    ),
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
        _out().print(
            f"connection {created.id} {created.name!r} ({created.provider}) created"
            f"{_schedule_text(schedule)}"
        )


@connections_app.command("list")
@guarded
def connections_list(
    workspace: str | None = WorkspaceOption,
    as_json: bool = JsonOption,
) -> None:
    """List connections (credentials are never shown, only whether there are any)."""
    with open_engine() as engine:
        ws = workspace_id(engine, workspace) if workspace else None
        found = engine.connections(ws)
    if as_json:
        emit_json([c.to_json() for c in found])
        return
    out = _out()
    if not found:
        out.print("no connections yet: `connector-sync connections create`")
        return
    columns = [
        Col("id", key=True, justify="right"),
        Col("workspace", keep=3, justify="right"),
        Col("name", text="fold"),
        Col("provider", keep=6),
        Col("status", key=True),
        Col("every", keep=5),
        Col("next run", keep=2),
        Col("creds", keep=1),
    ]
    rows: list[list[Cell]] = [
        [
            str(c.id),
            str(c.workspace_id),
            c.name,
            c.provider,
            styled(c.status),
            format_every(c.schedule_every.total_seconds()) if c.schedule_every else "-",
            when(c.next_run_at, seconds=False),
            "yes" if c.has_credentials else "no",
        ]
        for c in found
    ]
    out.print(fitted_table(columns, rows, out.width))


def _connection_details(c: Connection) -> Table:
    status: Cell = styled(c.status)
    if c.status == "disconnected":
        status = Text.assemble(
            styled(c.status),
            f" (the provider refused its credentials: `connector-sync connections update "
            f"{c.id} --credentials @FILE`)",
        )
    rows: list[tuple[str, Cell]] = [
        ("connection", f"{c.id} {c.name!r}"),
        ("workspace", str(c.workspace_id)),
        ("provider", c.provider),
        ("status", status),
        ("config", json.dumps(c.config)),
        ("credentials", "stored, encrypted" if c.has_credentials else "none"),
    ]
    if c.schedule_every:
        rows.append(("every", format_every(c.schedule_every.total_seconds())))
        rows.append(("next run", when(c.next_run_at)))
    rows.append(("created", when(c.created_at)))
    rows.append(("updated", when(c.updated_at)))
    return details(rows)


@connections_app.command("show")
@guarded
def connections_show(connection_id: int = ConnectionArg(), as_json: bool = JsonOption) -> None:
    """A connection and its recent runs."""
    with open_engine() as engine:
        c = engine.connection(connection_id)
        recent = engine.runs(connection_id=connection_id, limit=10)
    if as_json:
        emit_json({**c.to_json(), "recent_runs": [r.to_json() for r in recent]})
        return
    out = _out()
    out.print(_connection_details(c))
    if recent:
        out.print(runs_table(recent, out.width, title="recent runs"))


@connections_app.command("update")
@guarded
def connections_update(
    connection_id: int = ConnectionArg(),
    name: str | None = typer.Option(None, "--name", "-n", metavar="NAME", help="A new name."),
    config: str | None = typer.Option(
        None,
        "--config",
        metavar="JSON",
        help="Keys to change in the config (a key set to null is removed); JSON, @file or @-.",
    ),
    credentials: str | None = typer.Option(
        None,
        "--credentials",
        metavar="JSON",
        help="New credentials, replacing the old ones (a disconnected connection is active "
        "again); JSON, @file or @- (stdin).",
    ),
    every: str | None = typer.Option(
        None, "--every", metavar="DURATION", help="A new sync schedule: 15m, 1h, 1d..."
    ),
    no_schedule: bool = typer.Option(False, "--no-schedule", help="Sync only when asked."),
    as_json: bool = JsonOption,
) -> None:
    """Repair a connection: its name, config, credentials or schedule. What is not given stays
    as it is."""
    if every is not None and no_schedule:
        fail("give --every or --no-schedule, not both")
    if (name, config, credentials, every) == (None, None, None, None) and not no_schedule:
        fail("nothing to change: give --name, --config, --credentials, --every or --no-schedule")
    try:
        patch = parse_json_object(config, "--config") if config is not None else None
        creds = (
            parse_json_object(credentials, "--credentials", secret=True)
            if credentials is not None
            else None
        )
        schedule = parse_duration(every) if every else None
    except ValueError as exc:
        fail(str(exc))
    with open_engine() as engine:
        before = engine.connection(connection_id)
        updated = engine.update_connection(
            connection_id,
            name=name,
            config=patch,
            credentials=creds,
            schedule_every=schedule,
            no_schedule=no_schedule,
        )
    if as_json:
        emit_json(updated.to_json())
        return
    changed = [
        label
        for label, given in (
            ("name", name is not None),
            ("config", patch is not None),
            ("credentials", creds is not None),
            ("schedule", every is not None or no_schedule),
        )
        if given
    ]
    line = f"connection {updated.id} {updated.name!r} updated: {', '.join(changed)}"
    if before.status == "disconnected" and updated.status == "active":
        line += "; it is active again"
    _out().print(line + _schedule_text(updated.schedule_every if every else None))


def _set_status(action: Callable[[Engine], Connection], verb: str) -> None:
    with open_engine() as engine:
        c = action(engine)
    _out().print(f"connection {c.id} {verb} (status {c.status})")


@connections_app.command("pause")
@guarded
def connections_pause(connection_id: int = ConnectionArg()) -> None:
    """Pause a connection: no scheduled or manual syncs until it is resumed."""
    _set_status(lambda engine: engine.pause(connection_id), "paused")


@connections_app.command("resume")
@guarded
def connections_resume(
    connection_id: int = ConnectionArg(),
    force: bool = typer.Option(
        False,
        "--force",
        help="Resume a disconnected connection with the credentials the provider refused.",
    ),
) -> None:
    """Resume a paused connection (its schedule restarts from now). A disconnected one needs
    new credentials (`connections update CONNECTION --credentials @FILE`) or --force."""
    if force:
        print(
            "warning: --force resumes the connection with the credentials the provider "
            "refused; unless they work again, its next sync disconnects it again",
            file=sys.stderr,
        )
    _set_status(lambda engine: engine.resume(connection_id, force=force), "resumed")


@connections_app.command("delete")
@guarded
def connections_delete(connection_id: int = ConnectionArg(), as_json: bool = JsonOption) -> None:
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
    connection_id: int = ConnectionArg(),
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
                raise typer.Exit(INTERRUPTED) from None
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


def describe_progress(
    run: Run, *, workers_alive: int | None, now: datetime, workers_able: int | None = None
) -> str:
    """One line about where a run is; pure, for the live view and its plain-text twin.
    ``workers_able``: how many live workers have the run's provider installed."""
    if run.status == "queued":
        if run.attempts > 0 and run.queued_at > now:
            wait = (run.queued_at - now).total_seconds()
            why = brief_error(run.error, 60)
            return f"retrying in {wait:.0f}s (attempt {run.attempts + 1} of {run.max_attempts})" + (
                f" after {why}" if why else ""
            )
        if workers_alive == 0:
            return "queued; no worker is running: start one with `connector-sync worker`"
        if workers_able == 0 and run.kind == "sync":
            return (
                f"queued; no live worker has the {run.provider} connector: start a worker where "
                "its package is installed (workers load connectors when they start)"
            )
        return "queued, waiting for a worker"
    if run.status == "running":
        text = f"running attempt {run.attempts} of {run.max_attempts}"
        if run.cancel_requested_at is not None:
            text += ", cancel requested"
        return text
    if run.status == "waiting":
        return "waiting behind the sync still running"
    error = error_text(run.error, status=run.status)
    return run.status + (f": {error}" if error else "")


def live_workers(engine: Engine, provider: str) -> tuple[int, int]:
    """How many workers are alive, and how many of them have ``provider`` installed."""
    alive = [w for w in engine.workers() if worker_state(w, engine.settings) == "alive"]
    return len(alive), sum(w.can_run(provider) for w in alive)


def follow_view(progress: Progress, line: str) -> Group:
    """The live view: the bar on its own line, then what the run is doing, which wraps
    instead of pushing the run number and the bar off the line."""
    return Group(progress, Text(f"  {line}", overflow="fold"))


def follow_progress(out: Console, run_id: int, total: int | None) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("[bold]run #{task.fields[run_id]}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("tables · {task.fields[records]} records read"),
        console=out,
    )
    task = progress.add_task("sync", total=total, run_id=run_id, records=0)
    return progress, task


def follow_run(engine: Engine, run: Run, *, live: bool, interval: float = 0.5) -> Run:
    """Poll the run until it ends, showing tables done, records read, attempts and a
    countdown while a retry waits. Returns the final run."""
    out = _out()
    progress, task = follow_progress(out, run.id, table_count(run.provider))
    last_line = ""
    interactive = live and out.is_terminal
    checked_workers_at = 0.0
    alive: int | None = None
    able: int | None = None
    display = Live(console=out, refresh_per_second=8) if interactive else None
    with display or contextlib.nullcontext():
        while True:
            run = engine.run(run.id)
            if time.monotonic() - checked_workers_at > 5:
                checked_workers_at = time.monotonic()
                alive, able = live_workers(engine, run.provider)
            line = describe_progress(
                run, workers_alive=alive, now=datetime.now(UTC), workers_able=able
            )
            progress.update(task, completed=tables_done(run), records=run.processed_units)
            if display is not None:
                display.update(follow_view(progress, line))
            elif live and line != last_line:
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
        out.print(results_table(run, out.width))
    style = STATUS_STYLE.get(run.status, "")
    ended = Text(f"run #{run.id} {run.status}", style=style)
    tries = f"{run.attempts} attempt" + ("" if run.attempts == 1 else "s")
    if run.kind == "purge":
        ended.append(f" after {tries}: {run.processed_units} records purged")
    else:
        ended.append(f" after {tries}: {counts_text(run.results)}")
    out.print(ended)
    if run.error and run.status != "cancelled":
        out.print(Text(error_text(run.error, status=run.status), overflow="fold"))
    elif run.error:
        out.print(Text(f"({error_text(run.error, status=run.status)})", overflow="fold"))


def results_table(run: Run, width: int) -> Table:
    columns = [
        Col("table", key=True),
        Col("status", key=True),
        Col("upserted", keep=3, justify="right"),
        Col("unchanged", keep=1, justify="right"),
        Col("tombstoned", keep=2, justify="right"),
        Col("error", text="fold"),
    ]
    rows: list[list[Cell]] = [
        [
            name,
            styled(str(r.get("status", "pending"))),
            str(r.get("upserted", 0)),
            str(r.get("unchanged", 0)),
            str(r.get("tombstoned", 0)),
            error_text(r.get("error")),
        ]
        for name, r in sorted(run.results.items())
    ]
    return fitted_table(columns, rows, width, title="tables")


@runs_app.command("list")
@guarded
def runs_list(
    connection: int | None = typer.Option(
        None,
        "--connection",
        "-c",
        metavar="CONNECTION",
        min=1,
        help="A connection id (a deleted connection's runs are kept).",
    ),
    status: str | None = typer.Option(
        None, "--status", "-s", metavar="STATUS", help="queued, running, failed..."
    ),
    workspace: str | None = WorkspaceOption,
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=10_000),
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
    out = _out()
    out.print(runs_table(found, out.width) if found else "no runs")


def attempts_table(attempts: list[Attempt], width: int) -> Table:
    """Every claim of a run in order, numbered 1, 2, 3... (a handed-back or lost claim has a
    row of its own), each with the counts of that attempt alone."""
    columns = [
        Col("#", key=True, justify="right"),
        Col("outcome", key=True),
        Col("worker", keep=5),
        Col("started", keep=4),
        Col("took", keep=3, justify="right"),
        Col("upserted", keep=2, justify="right"),
        Col("unchanged", keep=0, justify="right"),
        Col("tombstoned", keep=1, justify="right"),
        Col("error", text="fold"),
    ]
    rows: list[list[Cell]] = []
    for number, a in enumerate(attempts, start=1):
        took = (a.finished_at - a.started_at).total_seconds() if a.finished_at else None
        c = counts(a.results)
        rows.append(
            [
                str(number),
                styled((a.outcome or "running").replace("_", " ")),
                a.worker_id,
                when(a.started_at),
                format_duration(took),
                str(c["upserted"]),
                str(c["unchanged"]),
                str(c["tombstoned"]),
                error_text(a.error, status=a.outcome),
            ]
        )
    return fitted_table(columns, rows, width, title="attempts")


@runs_app.command("show")
@guarded
def runs_show(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
    """A run: its state and lease, every attempt, and the per-table results."""
    with open_engine() as engine:
        run = engine.run(run_id)
        attempts = engine.attempts(run_id)
        alive, able = live_workers(engine, run.provider) if not run.is_terminal else (None, None)
    if as_json:
        emit_json({**run.to_json(), "attempts": [a.to_json() for a in attempts]})
        return
    out = _out()
    rows: list[tuple[str, Cell]] = [
        ("run", f"#{run.id} ({run.kind}, trigger {run.trigger})"),
        ("connection", connection_ref(run)),
        ("provider", run.provider),
        ("status", styled(run.status)),
        ("attempts", f"{run.attempts} of {run.max_attempts}"),
        ("queued", when(run.queued_at)),
        ("started", when(run.started_at)),
        ("finished", when(run.finished_at)),
    ]
    if run.kind == "purge":
        rows.append(("records", f"{run.processed_units} purged"))
    else:
        rows.append(("records", counts_text(run.results)))
        rows.append(("read", f"{run.processed_units} records"))
    if run.status == "running":
        rows.append(("lease owner", str(run.lease_owner)))
        rows.append(("lease expires", when(run.lease_expires_at)))
        rows.append(("worker", run.worker_id or "-"))
    if run.cancel_requested_at:
        rows.append(("cancel requested", when(run.cancel_requested_at)))
    if run.error:
        rows.append(("error", error_text(run.error, status=run.status)))
    if not run.is_terminal:  # a finished run's status and error say it all
        now = datetime.now(UTC)
        rows.append(
            ("now", describe_progress(run, workers_alive=alive, now=now, workers_able=able))
        )
    out.print(details(rows))
    if attempts:
        out.print(attempts_table(attempts, out.width))
    if run.results:
        out.print(results_table(run, out.width))


@runs_app.command("cancel")
@guarded
def runs_cancel(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
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
def runs_retry(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
    """Put a failed (dead-lettered) run back in the queue with a fresh set of attempts."""
    with open_engine() as engine:
        run = engine.retry_run(run_id)
    if as_json:
        emit_json(run.to_json())
    else:
        _out().print(f"run #{run.id} queued again ({run.max_attempts - run.attempts} attempts)")


# -- records -----------------------------------------------------------------------------------


@records_app.command("list")
@guarded
def records_list(
    connection_id: int = ConnectionArg(),
    table: str | None = typer.Argument(
        None, metavar="TABLE", help="One table (default: all of them)."
    ),
    deleted: bool = typer.Option(
        False, "--deleted", help="Include tombstoned rows (deleted upstream)."
    ),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=100_000),
    as_json: bool = JsonOption,
) -> None:
    """The records synced for CONNECTION: the rows in the `records` table, live ones unless
    --deleted."""
    with open_engine() as engine:
        engine.connection(connection_id)  # an unknown connection is an error, not "no records"
        found = engine.records(connection_id, table, include_deleted=deleted, limit=limit)
    if as_json:
        emit_json([r.to_json() for r in found])
        return
    out = _out()
    if not found:
        which = f"table {table} of " if table else ""
        out.print(f"no records in {which}connection {connection_id} yet")
        return
    out.print(records_table(found, out.width))
    if len(found) == limit:
        out.print(Text(f"the first {limit} records; --limit shows more", style="dim"))


def records_table(records: list[Record], width: int) -> Table:
    columns = [
        Col("table", key=True),
        Col("id", key=True),
        Col("updated", keep=2),
        Col("deleted", keep=1),
        Col("data", text="ellipsis"),
    ]
    rows: list[list[Cell]] = [
        [
            r.table_name,
            r.external_id,
            when(r.updated_at, seconds=False),
            when(r.deleted_at, seconds=False) if r.deleted_at else "-",
            json.dumps(r.data, separators=(",", ":"), ensure_ascii=False),
        ]
        for r in records
    ]
    return fitted_table(columns, rows, width)


# -- providers, secrets, the embedded database and the demo ------------------------------------


def _fields_text(fields: list[dict[str, Any]] | None) -> str:
    if fields is None:
        return "any (not declared)"
    if not fields:
        return "none"
    return ", ".join(f"{f['name']}{'' if f['required'] else ' (optional)'}" for f in fields)


@app.command()
@guarded
def providers(as_json: bool = JsonOption) -> None:
    """The installed connectors: each provider's tables, and its config and credential fields
    (required unless marked optional)."""
    described = describe_providers()
    if as_json:
        emit_json(described)
        return
    out = _out()
    columns = [
        Col("provider", key=True),
        Col("tables", text="fold"),
        Col("config", text="fold"),
        Col("credentials", text="fold"),
    ]
    rows: list[list[Cell]] = [
        [
            d["provider"],
            ", ".join(f"{t['name']} ({t['mode']})" for t in d["tables"]),
            _fields_text(d["config"]),
            _fields_text(d["credentials"]),
        ]
        for d in described
    ]
    out.print(fitted_table(columns, rows, out.width))
    out.print(Text("`connector-sync providers --json` gives types, defaults and descriptions"))


@secrets_app.command("rotate")
@guarded
def secrets_rotate(as_json: bool = JsonOption) -> None:
    """Re-encrypt every connection's credentials with the first key of
    CONNECTOR_SYNC_SECRET_KEYS; then the older keys can be removed."""
    with open_engine() as engine:
        count = engine.rotate_secret_keys()
        keyed = engine.settings.secret_keys is not None
        home = engine.settings.home
    if as_json:
        emit_json({"rotated": count})
        return
    key = (
        "the first key of CONNECTOR_SYNC_SECRET_KEYS" if keyed else f"the key in {home}/secret.key"
    )
    _out().print(f"re-encrypted the credentials of {count} connection(s) with {key}")


@db_app.command("status")
@guarded
def db_status(as_json: bool = JsonOption) -> None:
    """Whether the embedded Postgres exists and runs, where, and since when. Never starts it."""
    settings = load_settings()
    _session.use(settings, embedded=True)
    status = server_status(settings.home)
    configured = settings.database_url
    if as_json:
        emit_json({**status.to_json(), "database_url_set": configured is not None})
        return
    if status.running:
        state = f"running (pid {status.pid}, since {when(status.started_at)})"
    elif status.created:
        state = "stopped (the next command starts it)"
    else:
        state = "not created yet (the first command without DATABASE_URL creates it)"
    rows: list[tuple[str, Cell]] = [
        ("embedded", str(status.data_dir)),
        ("state", state),
    ]
    if status.socket_dir:
        rows.append(("socket", str(status.socket_dir)))
    rows.append(("log", str(status.log)))
    if configured:
        rows.append(("note", "DATABASE_URL is set, so commands use that database, not this one"))
    _out().print(details(rows))


@db_app.command("stop")
@guarded
def db_stop() -> None:
    """Stop the embedded Postgres (open sessions are ended; nothing committed is lost). The
    next command that needs it starts it again."""
    settings = load_settings()
    _session.use(settings, embedded=True)
    before = stop_server(settings.home)
    if before.running:
        _out().print(f"stopped the embedded Postgres under {before.data_dir} (pid {before.pid})")
    else:
        _out().print(f"the embedded Postgres under {before.data_dir} is not running")


@app.command()
@guarded
def demo(
    schema: str | None = typer.Option(
        None,
        "--schema",
        metavar="SCHEMA",
        help="Schema to use (default: the usual one on the embedded Postgres, "
        "connector_sync_demo on DATABASE_URL).",
    ),
) -> None:
    """The one-minute demo: a simulated provider, two workers, and everything the queue does."""
    from sync.demo import run_demo, tuned

    settings = load_settings()
    if schema is None and settings.database_url:
        schema = "connector_sync_demo"
    if schema is not None:
        settings = load_settings(schema_name=schema)
    with open_engine(tuned(settings), migrate_embedded=False, check=False) as engine:
        _session.announce()
        ok = run_demo(engine, console=_out())
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


# -- the entry point ---------------------------------------------------------------------------


def main(args: Sequence[str] | None = None) -> None:
    """``connector-sync``: a usage error is one line and exit 2, like every other mistake, and
    Ctrl-C exits 130 without a traceback."""
    _session.reset()
    try:
        code = app(args=args, prog_name="connector-sync", standalone_mode=False)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        code = INTERRUPTED
    except typer.Abort:
        code = INTERRUPTED
    except typer.TyperException as exc:
        code = _usage_error(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(exc: typer.TyperException) -> int:
    """A click usage error as one line. Asking for nothing prints the help instead."""
    ctx = getattr(exc, "ctx", None)
    message = exc.format_message()
    if ctx is not None and message == "Missing command.":
        print(ctx.get_help())
        return 0
    negative = re.fullmatch(r"No such option: (-\d+)", message)
    if negative:
        message = f"ids are positive numbers; {negative.group(1)} is not one"
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    text = " ".join((message[:1].lower() + message[1:]).split())
    print(f"error: {text}{hint}", file=sys.stderr, flush=True)
    return int(getattr(exc, "exit_code", USER_ERROR))


if __name__ == "__main__":
    main()
