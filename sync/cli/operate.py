"""Operating ``connector-sync``: the schema (``migrate``, ``grant``), workers, ``records list``,
``secrets rotate``, ``prune``, the embedded database (``db status|stop``) and the
demo."""

from __future__ import annotations

import json
import logging
import sys
from datetime import timedelta

import typer
from rich.table import Table
from rich.text import Text

from sync.base.embedded import server_status, stop_server
from sync.base.names import check_name
from sync.base.secrets import configured_keys, key_file
from sync.cli.common import (
    RUN_FAILED,
    ConnectionArg,
    JsonOption,
    app,
    db_app,
    emit_json,
    fail,
    guarded,
    load_settings,
    open_engine,
    records_app,
    secrets_app,
    session,
    stdout,
    warn,
    worker_state,
)
from sync.cli.console import (
    Cell,
    Col,
    details,
    fitted_table,
    format_duration,
    styled,
    when,
)
from sync.jobs.metrics import MetricsServer
from sync.models import Record
from sync.worker.services.cleaner import PruneReport, Retained

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
            stdout().print(f"applied {m.filename}")
    else:
        stdout().print(f"schema {schema} is up to date")


@app.command()
@guarded
def grant(
    role: str = typer.Argument(
        ..., metavar="ROLE", help="An existing database role (CREATE ROLE ... LOGIN)."
    ),
    read_only: bool = typer.Option(
        False,
        "--read-only",
        help="Let ROLE read the typed views of one workspace (-w) and nothing else.",
    ),
    workspace: str | None = typer.Option(
        None, "--workspace", "-w", metavar="WORKSPACE", help="Workspace id (digits) or name."
    ),
) -> None:
    """Give a runtime ROLE the data rights the API and workers need, and no DDL rights; or,
    with --read-only -w WORKSPACE, the right to read that workspace's typed views."""
    if read_only != (workspace is not None):
        fail("--read-only and --workspace go together: grant --read-only ROLE -w WORKSPACE")
    with open_engine() as engine:
        if workspace is not None:
            schemas = engine.grant_read_only(role, workspace)
            stdout().print(
                f"granted {role} read access to the typed views of workspace {workspace} "
                f"({schemas} schema(s) now, and those its syncs build later); nothing else"
            )
            return
        engine.grant(role)
        schema = engine.settings.schema_name
    stdout().print(f"granted {role} data rights on schema {schema} (no DDL)")


# -- workers -----------------------------------------------------------------------------------


AppOption = typer.Option(
    None,
    "--app",
    metavar="MODULE:FUNCTION",
    help="An application's setup(queues): declares its queues, registers its handlers. "
    "MODULE (looked for in the current directory too) or path/to/file.py. Repeatable; those "
    "installed under the entry points connector_sync.handlers load too.",
)


@app.command()
@guarded
def worker(
    once: bool = typer.Option(
        False, "--once", help="Poll once (claim at most one run), then exit."
    ),
    worker_id: str | None = typer.Option(
        None, "--id", metavar="ID", help="The worker's id (default: host-pid-random)."
    ),
    apps: list[str] | None = AppOption,
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        metavar="PORT",
        min=0,
        max=65535,
        help="Serve this worker's own Prometheus metrics at http://HOST:PORT/metrics.",
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1",
        "--metrics-host",
        metavar="HOST",
        help="The address --metrics-port listens on (0.0.0.0 for every interface).",
    ),
) -> None:
    """Run a worker: claim runs and execute them one at a time until SIGTERM or Ctrl-C.

    Run as many as you like, on any machines; SIGTERM hands the running run back at once. It
    runs syncs of the providers installed when it starts (restart it after installing a
    connector package) and of the declared providers (`providers add`, loaded as they come), and
    jobs of the application queues CONNECTOR_SYNC_LANES gives lanes
    (QUEUE=N,...), N at a time per queue."""
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
        service = engine.worker(worker_id=worker_id, listen=not once, apps=apps or ())
        session.announce()
        log = logging.getLogger("sync.worker")
        log.info("worker %s runs providers: %s", service.id, ", ".join(service.providers) or "none")
        served = None
        if metrics_port is not None:
            try:
                served = MetricsServer(service.metrics.registry, metrics_host, metrics_port)
            except OSError as exc:
                service.close()
                fail(
                    f"--metrics-port: cannot listen on {metrics_host}:{metrics_port} "
                    f"({exc.strerror or exc}); choose another port"
                )
            log.info("metrics at http://%s:%d/metrics", metrics_host, served.port)
        try:
            service.run(once=once)
        finally:
            if served is not None:
                served.stop()


@app.command("workers")
@guarded
def workers_command(as_json: bool = JsonOption) -> None:
    """Worker processes: alive, stale or stopped, what each runs and can run.

    Stale: no heartbeat lately (crashed, frozen or cut off). Below the table: queued runs that
    no live worker can take, and why."""
    with open_engine() as engine:
        found = engine.workers()
        orphans = [] if as_json else engine.queued_without_worker()
        settings = engine.settings
    if as_json:
        emit_json([{**w.to_json(), "state": worker_state(w, settings)} for w in found])
        return
    out = stdout()
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
            Col("providers", text="words", keep=3),
            Col("lanes", text="words", keep=4),
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
                ", ".join(f"{q}={n}" for q, n in (w.lanes or {}).items()) or "-",
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
    """The records synced for CONNECTION (live ones unless --deleted).

    They are the rows of the `records` table; --json prints their data whole."""
    with open_engine() as engine:
        engine.connection(connection_id)  # an unknown connection is an error, not "no records"
        found = engine.records(connection_id, table, include_deleted=deleted, limit=limit)
    if as_json:
        emit_json([r.to_json() for r in found])
        return
    out = stdout()
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


# -- secrets, the embedded database and the demo ----------------------------------------------


@secrets_app.command("rotate")
@guarded
def secrets_rotate(as_json: bool = JsonOption) -> None:
    """Re-encrypt every connection's credentials with the newest key.

    The newest is the first of CONNECTOR_SYNC_SECRET_KEYS (NEW,OLD); once this is done, the
    older keys can be removed. It never makes a key: the one it encrypts with must already be
    where every process reads it."""
    settings = load_settings()
    keys, path = configured_keys(settings), key_file(settings.home)
    if keys is None and not path.exists():
        fail(
            f"no key to re-encrypt with: CONNECTOR_SYNC_SECRET_KEYS is unset and {path} does not "
            "exist; set CONNECTOR_SYNC_SECRET_KEYS to NEW,OLD on every machine, then run this"
        )
    with open_engine(settings) as engine:
        count = engine.rotate_secret_keys()
    if keys is not None and count and path.exists() and path.read_text().strip() != keys[0]:
        # A command run without the variable (a new shell, a service file without it) would
        # read the key file, which no longer decrypts anything.
        warn(
            "the credentials are now encrypted with the first key of CONNECTOR_SYNC_SECRET_KEYS, "
            f"which {path} does not hold: keep that variable set wherever connector-sync runs"
        )
    if as_json:
        emit_json({"rotated": count})
        return
    out = stdout()
    if keys is not None:
        out.print(
            f"re-encrypted the credentials of {count} connection(s) with the first key of "
            "CONNECTOR_SYNC_SECRET_KEYS"
        )
        return
    out.print(f"re-encrypted the credentials of {count} connection(s) with the key in {path}")
    out.print(
        Text(
            "that file holds the only key, so the key is unchanged; to move to a new one, set "
            "CONNECTOR_SYNC_SECRET_KEYS to NEW,OLD (OLD: the file's key) and run this again",
            style="dim",
        )
    )


# -- retention ---------------------------------------------------------------------------------


@app.command()
@guarded
def prune(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Count what would be deleted; delete nothing."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Delete old history now, as the workers' cleaner does every hour, and say what went.

    Finished runs older than CONNECTOR_SYNC_HISTORY_DAYS (30) beyond the newest 20 of each
    connection, with their attempts; workers stopped for over a day; ended rate budgets; seen
    keys of ended runs; finished jobs past their queue's retention, with their attempts;
    finished ingestions older than the history days; tombstoned records only when
    CONNECTOR_SYNC_TOMBSTONE_DAYS is set. Runs, jobs and ingestions that are waiting, queued or
    running are never deleted."""
    with open_engine() as engine:
        report = engine.prune(dry_run=dry_run)
    if as_json:
        emit_json(report.to_json())
        return
    out = stdout()
    verb = "would delete" if dry_run else "deleted"
    columns = [
        Col("kind", key=True),
        Col(verb, key=True, justify="right"),
        Col("rule", text="fold"),
    ]
    out.print(fitted_table(columns, prune_rows(report), out.width))
    total = sum(
        n
        for kind, n in report.deleted.items()
        if kind not in (Retained.ATTEMPTS, Retained.JOB_ATTEMPTS)
    )
    out.print(f"{verb} {total:,} row(s) and their attempts in {report.statements} statement(s)")


def _days(value: timedelta) -> str:
    days = value / timedelta(days=1)
    return f"{days:g} day" + ("" if days == 1 else "s")


def prune_rows(report: PruneReport) -> list[list[Cell]]:
    """One row per kind of row retention deletes: how many, and by which rule."""
    rules = report.rules
    rule = {
        Retained.RUNS: f"finished over {_days(rules.history)} ago, beyond the newest "
        f"{rules.keep_runs} of their connection",
        Retained.ATTEMPTS: "of those runs",
        Retained.SEEN_KEYS: "of runs neither queued nor running",
        Retained.WORKERS: f"stopped, or silent, for over {_days(rules.stopped_workers)}",
        Retained.RATE_BUDGETS: "blocks that have ended",
        Retained.HTTP_CACHE: f"ETag cache entries unused for {_days(rules.http_cache)}",
        Retained.JOBS: "completed, dead or cancelled longer ago than their queue's retention",
        Retained.JOB_ATTEMPTS: "of those jobs",
        Retained.INGESTIONS: f"finished over {_days(rules.history)} ago",
        Retained.TOMBSTONES: (
            "kept: CONNECTOR_SYNC_TOMBSTONE_DAYS is unset"
            if rules.tombstones is None
            else f"records tombstoned over {_days(rules.tombstones)} ago"
        ),
    }
    return [
        [
            kind.value.replace("_", " "),
            "-" if kind is Retained.TOMBSTONES and rules.tombstones is None else f"{n:,}",
            rule[kind],
        ]
        for kind, n in report.deleted.items()
    ]


@db_app.command("status")
@guarded
def db_status(as_json: bool = JsonOption) -> None:
    """Whether the embedded Postgres exists and runs, where, and since when. Never starts it."""
    settings = load_settings()  # the footer names the database commands use, as everywhere
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
    stdout().print(details(rows))


@db_app.command("stop")
@guarded
def db_stop() -> None:
    """Stop the embedded Postgres; the next command that needs it starts it again.

    Open sessions are ended; nothing committed is lost."""
    settings = load_settings()
    before = stop_server(settings.home)
    if before.running:
        line = f"stopped the embedded Postgres under {before.data_dir} (pid {before.pid})"
    else:
        line = f"the embedded Postgres under {before.data_dir} is not running"
    if settings.database_url:
        line += "; DATABASE_URL is set, so commands use that database, not this one"
    stdout().print(line)


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
        session.announce()
        ok = run_demo(engine, console=stdout())
    if not ok:
        raise typer.Exit(RUN_FAILED)
