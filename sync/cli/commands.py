"""The ``connector-sync`` command line: a thin layer over the Python API (``sync.api.Engine``).

It never runs SQL itself. Output is for people by default, as wide as the terminal (or
``$COLUMNS``), and one JSON document on stdout with ``--json``. Every mistake, a usage error
included (an unknown id, bad JSON, a word where a number goes, an unreachable or unmigrated
database), is one line on stderr and exit code 2; a sync that ends badly under ``sync --wait``
exits 1; Ctrl-C exits 130 without a traceback. Each command says on stderr which database it
used, also when it fails. With ``DATABASE_URL`` unset every command uses the embedded Postgres
under ``$CONNECTOR_SYNC_HOME`` (the user's data directory by default), migrated on first use.

This module holds ``sync`` and ``runs`` and the entry point; the other commands are in
``sync.cli.tenants``, ``sync.cli.operate``, ``sync.cli.documents`` and ``sync.cli.queues``, what
they share in ``sync.cli.common``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

import connectors
from sync.api import Engine
from sync.base.database_url import describe

# The other commands register themselves on `app` when imported.
from sync.cli import documents, operate, providers, queues, readers, tenants
from sync.cli.common import (
    INTERRUPTED,
    RUN_FAILED,
    RUN_STATUSES,
    USER_ERROR,
    ConnectionArg,
    JsonOption,
    RunArg,
    WorkspaceOption,
    WrappedWarnings,
    app,
    brief_error,
    connection_names,
    connection_ref,
    counts,
    counts_text,
    emit_json,
    fail,
    guarded,
    load_settings,
    open_engine,
    runs_app,
    runs_table,
    session,
    stdout,
    worker_state,
    workspace_id,
)
from sync.cli.console import (
    STATUS_STYLE,
    Cell,
    Col,
    details,
    error_text,
    fitted_table,
    format_duration,
    retry_when,
    styled,
    when,
)
from sync.models import Attempt, Run
from sync.overview import describe_progress as describe_where
from sync.runs.decide import ordinal
from sync.vocabulary import RunKind, RunStatus, TableStatus

__all__ = ["app", "documents", "main", "operate", "providers", "queues", "readers", "tenants"]

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
            session.announce()
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
        verb = (
            "queued"
            if run.status == RunStatus.QUEUED and run.attempts == 0
            else "already " + run.status
        )
        stdout().print(f"run #{run.id} {verb} for connection {connection_id}")
    if wait and run.status != RunStatus.SUCCEEDED:
        session.announce()
        raise typer.Exit(RUN_FAILED)


def table_count(provider: str) -> int | None:
    try:
        return len(connectors.get(provider).tables)
    except connectors.UnknownProvider:
        return None


def tables_done(run: Run) -> int:
    return sum(
        1
        for r in run.results.values()
        if r.get("status") in (TableStatus.SUCCEEDED, TableStatus.FAILED)
    )


def describe_progress(
    run: Run,
    *,
    workers_alive: int | None,
    now: datetime,
    workers_able: int | None = None,
    countdown: bool = True,
) -> str:
    """One line about where a run is; pure, for the live view and its plain-text twin.
    ``workers_able``: how many live workers have the run's provider installed. Without
    ``countdown`` a retry says when it starts rather than in how many seconds, so that the line
    changes only when the run's state does (output without a terminal prints each change)."""
    if run.status == RunStatus.QUEUED:
        if run.waits and run.waiting_until is not None and run.waiting_until > now:
            until = run.waiting_until.astimezone(UTC)
            clock = (
                f"{until:%H:%M}" if until - now < timedelta(hours=20) else f"{until:%b %d %H:%M}"
            )
            return f"waiting for {run.waiting_for} until {clock} UTC, {ordinal(run.waits)} wait"
        if run.attempts > 0 and run.queued_at > now:
            why = brief_error(run.error, 60)
            return (
                f"retrying {retry_when(run.queued_at, now, countdown=countdown)} "
                f"(attempt {run.attempts + 1} of {run.max_attempts})"
                + (f" after {why}" if why else "")
            )
        if workers_alive == 0:
            return "queued; no worker is running: start one with `connector-sync worker`"
        if workers_able == 0 and run.kind == RunKind.SYNC:
            return (
                f"queued; no live worker has the {run.provider} connector: start a worker where "
                "its package is installed (workers load connectors when they start)"
            )
        return "queued, waiting for a worker"
    if run.status == RunStatus.RUNNING:
        text = f"running attempt {run.attempts} of {run.max_attempts}"
        if run.cancel_requested_at is not None:
            text += ", cancel requested"
        where = describe_where(run.progress)
        return f"{text}: {where}" if where else text
    if run.status == RunStatus.WAITING:
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
        TextColumn("{task.fields[unit]}"),
        console=out,
    )
    task = progress.add_task("sync", total=total, run_id=run_id, unit="tables · 0 records read")
    return progress, task


def follow_run(
    engine: Engine,
    run: Run,
    *,
    live: bool,
    interval: float = 0.5,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    sleep: Callable[[float], None] = time.sleep,
) -> Run:
    """Poll the run until it ends, showing tables done, records read, attempts and a
    countdown while a retry waits. Without a terminal, a line is printed each time what the
    run is doing changes (a wait prints one line, with the time it ends, not one a second).
    Returns the final run."""
    out = stdout()
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
                run,
                workers_alive=alive,
                now=clock(),
                workers_able=able,
                countdown=display is not None,
            )
            # The bar follows the table being read when the provider said its size.
            at = run.progress or {}
            if run.status == RunStatus.RUNNING and at.get("total"):
                done, of = at.get("records", 0), at["total"]
                unit = f"{at['table']} records"
                if at.get("total_estimated"):
                    unit += " (total estimated)"
            else:
                done, of = tables_done(run), table_count(run.provider)
                unit = f"tables · {run.processed_units} records read"
            progress.update(task, completed=done, total=of, unit=unit)
            if display is not None:
                display.update(follow_view(progress, line))
            elif live and line != last_line:
                out.print(f"run #{run.id}: {line}")
            last_line = line
            if run.is_terminal:
                break
            sleep(interval)
    if live:
        print_results(out, run)
    return run


def print_results(out: Console, run: Run) -> None:
    if run.results:
        print_with_errors(out, results_table(run, out.width), table_errors(run))
    style = STATUS_STYLE.get(run.status, "")
    ended = Text(f"run #{run.id} {run.status}", style=style)
    tries = f"{run.attempts} attempt" + ("" if run.attempts == 1 else "s")
    if run.kind == RunKind.PURGE:
        ended.append(f" after {tries}: {run.processed_units} records purged")
    else:
        ended.append(f" after {tries}: {counts_text(run.results)}")
    out.print(ended)
    if run.cancel_came_late:
        out.print(f"a cancel was asked for after the work was done: the run ended {run.status}")
    if run.error and run.status != RunStatus.CANCELLED:
        out.print(Text(error_text(run.error, status=run.status), overflow="fold"))
    elif run.error:
        out.print(Text(f"({error_text(run.error, status=run.status)})", overflow="fold"))


def print_with_errors(out: Console, table: Table, errors: list[tuple[str, Cell]]) -> None:
    """A table, then its rows' errors below it in full, each wrapped at the console's width
    under the name of its row: a column of errors is too narrow for URLs and paths."""
    out.print(table)
    if errors:
        out.print(details(errors))


def results_table(run: Run, width: int) -> Table:
    """The per-table results; their errors are ``table_errors``, printed below."""
    columns = [
        Col("table", key=True),
        Col("status", key=True),
        Col("upserted", keep=3, justify="right"),
        Col("unchanged", keep=1, justify="right"),
        Col("tombstoned", keep=2, justify="right"),
    ]
    rows: list[list[Cell]] = [
        [
            name,
            styled(str(r.get("status", "pending"))),
            str(r.get("upserted", 0)),
            str(r.get("unchanged", 0)),
            str(r.get("tombstoned", 0)),
        ]
        for name, r in sorted(run.results.items())
    ]
    return fitted_table(columns, rows, width, title="tables")


def table_errors(run: Run) -> list[tuple[str, Cell]]:
    """Each table's error, and its warnings (a typed column widened for readers)."""
    found: list[tuple[str, Cell]] = []
    for name, r in sorted(run.results.items()):
        if r.get("error"):
            found.append((f"{name} error", error_text(r["error"])))
        found += [(f"{name} warning", str(w)) for w in r.get("warnings") or ()]
    return found


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
        found = engine.runs(
            connection_id=connection,
            status=RunStatus(status) if status else None,
            workspace_id=ws,
            limit=limit,
        )
        names = connection_names(engine)
    if as_json:
        emit_json([r.to_json() for r in found])
        return
    out = stdout()
    out.print(runs_table(found, out.width, names=names) if found else "no runs")


def attempts_table(attempts: list[Attempt], width: int) -> Table:
    """Every claim of a run in order, numbered 1, 2, 3... (a handed-back or lost claim has a
    row of its own), each with the counts of that attempt alone; their errors are
    ``attempt_errors``, printed below. The counts never leave: the worker and the start wrap
    to make room, and how long it took goes first."""
    columns = [
        Col("#", key=True, justify="right"),
        Col("outcome", key=True),
        Col("worker", text="fold", keep=2),
        Col("started", text="words", keep=1),
        Col("took", keep=0, justify="right"),
        Col("upserted", key=True, justify="right"),
        Col("unchanged", key=True, justify="right"),
        Col("tombstoned", key=True, justify="right"),
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
            ]
        )
    return fitted_table(columns, rows, width, title="attempts")


def attempt_errors(attempts: list[Attempt]) -> list[tuple[str, Cell]]:
    return [
        (f"attempt {number} error", error_text(a.error, status=a.outcome))
        for number, a in enumerate(attempts, start=1)
        if a.error
    ]


@runs_app.command("show")
@guarded
def runs_show(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
    """A run: its state and lease, every attempt, and the per-table results."""
    with open_engine() as engine:
        run = engine.run(run_id)
        attempts = engine.attempts(run_id)
        alive, able = live_workers(engine, run.provider) if not run.is_terminal else (None, None)
        names = connection_names(engine)
    if as_json:
        emit_json({**run.to_json(), "attempts": [a.to_json() for a in attempts]})
        return
    out = stdout()
    rows: list[tuple[str, Cell]] = [
        ("run", f"#{run.id} ({run.kind}, trigger {run.trigger})"),
        ("connection", connection_ref(run, names)),
        ("provider", run.provider),
        ("status", styled(run.status)),
        ("attempts", f"{run.attempts} of {run.max_attempts}"),
        ("queued", when(run.first_queued_at or run.queued_at)),
        ("started", when(run.started_at)),
    ]
    if run.status == RunStatus.QUEUED and run.attempts > 0:
        # Queued again after an attempt (a retry, a hand-back): when the next one may start.
        rows.append(("retry due", when(run.queued_at)))
    rows.append(("finished", when(run.finished_at)))
    if run.kind == RunKind.PURGE:
        rows.append(("records", f"{run.processed_units} purged"))
    else:
        rows.append(("records", counts_text(run.results)))
        rows.append(("read", f"{run.processed_units} records"))
        if run.waits:
            rows.append(("waits", f"{run.waits} for {run.waiting_for}"))
    if run.status == RunStatus.RUNNING:
        rows.append(("lease owner", str(run.lease_owner)))
        rows.append(("lease expires", when(run.lease_expires_at)))
        rows.append(("worker", run.worker_id or "-"))
    if run.cancel_requested_at:
        late = f", after the work was done: it ended {run.status}" if run.cancel_came_late else ""
        rows.append(("cancel requested", when(run.cancel_requested_at) + late))
    if run.error:
        # Why a cancelled run ended is no error.
        label = "why" if run.status == RunStatus.CANCELLED else "error"
        rows.append((label, error_text(run.error, status=run.status)))
    if not run.is_terminal:  # a finished run's status and error say it all
        now = datetime.now(UTC)
        rows.append(
            ("now", describe_progress(run, workers_alive=alive, now=now, workers_able=able))
        )
    out.print(details(rows))
    if attempts:
        print_with_errors(out, attempts_table(attempts, out.width), attempt_errors(attempts))
    if run.results:
        print_with_errors(out, results_table(run, out.width), table_errors(run))


@runs_app.command("cancel")
@guarded
def runs_cancel(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
    """Cancel a queued run at once, or ask a running one to stop (it keeps its results)."""
    with open_engine() as engine:
        run = engine.cancel_run(run_id)
    if as_json:
        emit_json(run.to_json())
    elif run.status == RunStatus.CANCELLED:
        stdout().print(f"run #{run.id} cancelled")
    else:
        stdout().print(f"run #{run.id} is running: its worker was asked to stop it")


@runs_app.command("retry")
@guarded
def runs_retry(run_id: int = RunArg(), as_json: bool = JsonOption) -> None:
    """Put a failed (dead-lettered) or cancelled run back in the queue with a fresh set of
    attempts."""
    with open_engine() as engine:
        run = engine.retry_run(run_id)
    if as_json:
        emit_json(run.to_json())
    else:
        stdout().print(f"run #{run.id} queued again ({run.max_attempts - run.attempts} attempts)")


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
        database = session.where or describe(engine.url)
        session.announce()

        def ready(url: str) -> None:
            mode = " (read-only)" if read_only else ""
            print(f"serving the operator page on {url}{mode}", file=sys.stderr, flush=True)

        options = replace(options, database=database)
        serve(engine, options, host=host, port=port, on_ready=ready)


# -- the entry point ---------------------------------------------------------------------------


def main(args: Sequence[str] | None = None) -> None:
    """``connector-sync``: a usage error is one line and exit 2, like every other mistake, and
    Ctrl-C exits 130 without a traceback."""
    session.reset()
    logging.lastResort = WrappedWarnings()
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
