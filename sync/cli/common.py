"""What every command of ``connector-sync`` shares: the Typer apps and their help, the one-line
errors (exit 2, never a traceback, never a password), which database a command uses and says it
used, opening the Engine on it, parsing durations and JSON input, and the tables of runs.

Commands live by subject in ``sync.cli`` (sync and runs, the entry point),
``sync.cli.tenants`` (workspaces and connections) and ``sync.cli.operate`` (schema, workers,
records, providers, secrets, the embedded database, the demo).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import psycopg
import typer
import typer.core
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

import connectors
from sync import overview
from sync.api import Engine, describe_database
from sync.base.database_url import describe, is_valid, scrub
from sync.base.embedded import data_dir, embedded_url
from sync.base.settings import Settings
from sync.cli.console import (
    Cell,
    Col,
    console,
    error_text,
    fitted_table,
    format_duration,
    styled,
    when,
)
from sync.errors import SyncError
from sync.models import Run, WorkerInfo
from sync.store.db import connect, first_line
from sync.vocabulary import JobError, RunKind, RunStatus

P = ParamSpec("P")
R = TypeVar("R")

USER_ERROR = 2
RUN_FAILED = 1
INTERRUPTED = 130
RUN_STATUSES = tuple(RunStatus)


def _without_type_placeholders(params: Sequence[Any]) -> None:
    # typer shows a type placeholder such as `<bool>` after every flag, `--help` included, and
    # `<str>` or `<int>` after an option or argument that names no placeholder of its own:
    # flags get none, the others their name (`--host HOST`, `{RUN}`). An argument's row shows
    # its type (`<str>`, `<int range> [x>=1]`) whatever its placeholder: its name and help say
    # what it is, so the row shows no type.
    for param in params:
        if param.param_type_name == "argument":
            param.display_type_rich = _no_type
            param._get_number_range_help_str = _no_range
        if param.metavar is not None:
            continue
        param.metavar = "" if getattr(param, "is_flag", False) else param.name.upper()


def _no_type(ctx: Any) -> None:
    return None


def _no_range() -> None:
    return None


def reflowed(help_text: str | None) -> str | None:
    """A help text with each paragraph on one line, for the console to wrap at its width.

    typer keeps the line breaks of a docstring's later paragraphs (and of the first one in a
    group's list of commands), so a text wrapped at 96 columns in the source breaks raggedly at
    80. A paragraph that starts with ``\\b`` keeps its lines, as click documents."""
    if not help_text:
        return help_text
    body, cut, rest = inspect.cleandoc(help_text).partition("\f")
    paragraphs = [
        p if p.startswith("\b") else " ".join(p.split()) for p in body.strip().split("\n\n")
    ]
    return "\n\n".join(paragraphs) + cut + rest


class _Group(typer.core.TyperGroup):
    """Help without typer's type placeholders, and paragraphs that wrap at the console's
    width, for every command of the group."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _without_type_placeholders(params)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _without_type_placeholders(command.get_params(ctx))
            command.help = reflowed(command.help)
        return command


def command_group(help_text: str) -> typer.Typer:
    return typer.Typer(help=help_text, cls=_Group, no_args_is_help=True)


app = typer.Typer(
    name="connector-sync",
    help="Keep third-party SaaS data synced into your Postgres, with Postgres as the queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)
workspaces_app = command_group("Workspaces: the tenants connections belong to.")
connections_app = command_group("Connections: one provider account synced into Postgres.")
runs_app = command_group("Runs: syncs and purges, their attempts and results.")
records_app = command_group("Records: the rows synced from providers.")
secrets_app = command_group("Secrets: the keys that encrypt connection credentials.")
db_app = command_group("The embedded Postgres used when DATABASE_URL is unset.")
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


def stdout() -> Console:
    return console()


# -- errors: one line, exit 2 ------------------------------------------------------------------


def fail(message: str, code: int = USER_ERROR) -> NoReturn:
    """Print one line on stderr, naming the database the command used, and exit."""
    line = " ".join(scrub(str(message), session.url).split())
    if session.where and session.target not in line:
        line += f" (database: {session.where})"
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def setting_problems(exc: ValidationError) -> str:
    """What is wrong with the settings, never a value given (which may be a secret): each
    field and its problem, or a problem of several fields as the check said it."""
    problems = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"])
        message = e["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


def warn(message: str) -> None:
    """A warning on stderr, wrapped at the console's width like the rest of the output."""
    Console(stderr=True, highlight=False).print(Text(f"warning: {message}"))


YesOption = typer.Option(False, "--yes", "-y", help="Do not ask first (on a terminal).")


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` first when a person is at a terminal (and ``--yes`` was not given); a
    script's stdin is no terminal, and is never asked. Anything but yes exits 1, doing nothing."""
    if yes or not sys.stdin.isatty():
        return
    if not typer.confirm(question, default=False, err=True):
        print("nothing was done", file=sys.stderr, flush=True)
        raise typer.Exit(1)


class WrappedWarnings(logging.Handler):
    """Where the engine's warnings go when nothing has configured logging (every command but
    ``worker`` and ``ui``, which log with timestamps): ``logging.lastResort``. Python's own
    prints each one as a single line, however long; this one wraps it at the console's width
    like the rest of the output, and scrubs the database URL's secrets from it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"{record.levelname.lower()}: {scrub(record.getMessage(), session.url)}"
            Console(stderr=True, highlight=False).print(Text(line))
        except Exception:
            self.handleError(record)


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
            fail(f"invalid setting ({setting_problems(exc)})")
        except connectors.UnknownProvider as exc:
            fail(str(exc))
        except psycopg.OperationalError as exc:
            fail(f"the database connection failed: {first_line(exc)}")
        except psycopg.Error as exc:
            fail(f"the database refused the request: {first_line(exc)}", code=1)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            raise typer.Exit(INTERRUPTED) from None
        session.announce()
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

    def use(self, settings: Settings) -> None:
        url = self.url = settings.database_url
        if url and not is_valid(url):  # its error says what is wrong with it
            self.where = None
            return
        self.target = describe(url) if url else str(data_dir(settings.home))
        self.where = describe_database(settings)

    def announce(self) -> None:
        if self.where and not self._announced:
            self._announced = True
            print(f"database: {self.where}", file=sys.stderr, flush=True)


session = _Session()


def load_settings(**overrides: Any) -> Settings:
    settings = Settings(**overrides)
    session.use(settings)
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
    session.use(settings)
    url, embedded = resolve_database(settings)
    connect(settings, url).close()  # fails fast, in one line, if it is unreachable
    engine = Engine(settings, database_url=url)
    try:
        if embedded and migrate_embedded:
            if engine.migrate() and session.where:
                session.where += " (migrated just now)"
        elif check:
            engine.check_schema()
        yield engine
    finally:
        engine.close()


# -- input parsing (pure) ----------------------------------------------------------------------


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


def brief_error(error: JobError | Mapping[str, Any] | None, limit: int = 70) -> str:
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


def connection_ref(run: Run, names: Mapping[int, str] | None = None) -> str:
    """A run's connection as people read it: ``tracker (3)``, or its id once deleted."""
    if run.connection_id is not None:
        name = (names or {}).get(run.connection_id)
        return f"{name} ({run.connection_id})" if name else str(run.connection_id)
    if run.deleted_connection_id is not None:
        return f"{run.deleted_connection_id} (deleted)"
    return "(deleted)"


def connection_names(engine: Engine) -> dict[int, str]:
    return {c.id: c.name for c in engine.connections()}


def runs_table(
    runs: list[Run], width: int, title: str | None = None, names: Mapping[int, str] | None = None
) -> Table:
    columns = [
        Col("run", key=True),
        Col("connection", text="ellipsis", keep=9),
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
        synced = run.kind == RunKind.SYNC
        rows.append(
            [
                f"#{run.id}",
                connection_ref(run, names),
                run.provider,
                run.kind,
                styled(run.status),
                run.trigger,
                f"{run.attempts}/{run.max_attempts}",
                when(run.first_queued_at or run.queued_at, seconds=False),
                format_duration(run_duration(run)),
                str(c["upserted"]) if synced else "-",
                str(c["tombstoned"]) if synced else "-",
                reason_or_error(run.error, run.status),
            ]
        )
    return fitted_table(columns, rows, width, title=title)


def reason_or_error(error: JobError | None, status: str) -> Cell:
    """A run's error, or, for a cancelled run, why it ended: dim, since it is no error."""
    text = error_text(error, status=status)
    return Text(text, style="dim") if status == RunStatus.CANCELLED else text


def worker_state(worker: WorkerInfo, settings: Settings) -> str:
    """alive, stale (no heartbeat for three intervals: crashed or frozen) or stopped."""
    return str(overview.worker_state(worker, settings.stale_after))


def workspace_id(engine: Engine, ref: str) -> int:
    return engine.workspace(ref).id
