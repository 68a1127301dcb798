"""``connector-sync workspaces`` and ``connector-sync connections``: create, list, show, and the
repairs (rename, delete, update, pause, resume) over ``Engine``."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import typer
from rich.table import Table
from rich.text import Text

from sync.api import Engine
from sync.base.durations import format_every, parse_duration
from sync.cli.common import (
    ConnectionArg,
    JsonOption,
    WorkspaceOption,
    YesOption,
    confirm,
    connections_app,
    emit_json,
    fail,
    guarded,
    open_engine,
    parse_json_object,
    runs_table,
    stdout,
    warn,
    workspace_id,
    workspaces_app,
)
from sync.cli.console import (
    Cell,
    Col,
    details,
    fitted_table,
    styled,
    when,
)
from sync.models import Connection
from sync.vocabulary import ConnectionStatus, RunStatus

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
        stdout().print(f"workspace {ws.id} {ws.name!r} created")


@workspaces_app.command("list")
@guarded
def workspaces_list(as_json: bool = JsonOption) -> None:
    """List workspaces (a deleted one stays listed until its connections are purged)."""
    with open_engine() as engine:
        found = engine.workspaces()
    if as_json:
        emit_json([w.to_json() for w in found])
        return
    out = stdout()
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
        stdout().print(f"workspace {ws.id} renamed {ws.name!r}")


@workspaces_app.command("delete")
@guarded
def workspaces_delete(
    workspace: str = typer.Argument(..., metavar="WORKSPACE", help="Workspace id or name."),
    yes: bool = YesOption,
    as_json: bool = JsonOption,
) -> None:
    """Delete a workspace and every connection in it; its run history is kept.

    A purge run removes each connection's records (behind a sync still running); the name is
    free again at once. On a terminal it asks first (--yes does not)."""
    with open_engine() as engine:
        ws = engine.workspace(workspace)
        count = len(engine.connections(ws.id))
        confirm(
            f"Delete workspace {ws.id} {ws.name!r} and purge its {count} connection(s) and every "
            "record they synced?",
            yes=yes,
        )
        purges = engine.delete_workspace(ws.id)
    if as_json:
        emit_json({"workspace": ws.to_json(), "purges": [p.to_json() for p in purges]})
        return
    out = stdout()
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
    schema: str | None = typer.Option(
        None,
        "--schema",
        metavar="NAME",
        help="The schema of its typed views (default: WORKSPACE_CONNECTION, in lower case).",
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
            schema=schema,
        )
    if as_json:
        emit_json(created.to_json())
    else:
        stdout().print(
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
        workspaces = {w.id: w.name for w in engine.workspaces()}
    if as_json:
        emit_json([c.to_json() for c in found])
        return
    out = stdout()
    if not found:
        out.print("no connections yet: `connector-sync connections create`")
        return
    columns = [
        Col("id", key=True, justify="right"),
        # Leaving first when there is no room: the next run (`connections show` has it), then
        # the workspace; whether there are credentials stays longer.
        Col("workspace", text="ellipsis", keep=2),
        Col("name", text="fold"),
        Col("provider", keep=6),
        Col("status", key=True),
        Col("every", keep=5),
        Col("next run", keep=1),
        Col("creds", keep=3),
    ]
    rows: list[list[Cell]] = [
        [
            str(c.id),
            workspaces.get(c.workspace_id, str(c.workspace_id)),
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


def _connection_details(c: Connection, workspace: str) -> Table:
    status: Cell = styled(c.status)
    if c.status == ConnectionStatus.DISCONNECTED:
        status = Text.assemble(
            styled(c.status),
            f" (the provider refused its credentials: `connector-sync connections update "
            f"{c.id} --credentials @FILE`)",
        )
    rows: list[tuple[str, Cell]] = [
        ("connection", f"{c.id} {c.name!r}"),
        ("workspace", f"{c.workspace_id} {workspace!r}"),
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
        workspace = engine.workspace(c.workspace_id).name
    if as_json:
        emit_json({**c.to_json(), "recent_runs": [r.to_json() for r in recent]})
        return
    out = stdout()
    out.print(_connection_details(c, workspace))
    if recent:
        out.print(runs_table(recent, out.width, title="recent runs", names={c.id: c.name}))


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
    schema: str | None = typer.Option(
        None,
        "--schema",
        metavar="NAME",
        help="The schema of its typed views, before its first sync builds them.",
    ),
    as_json: bool = JsonOption,
) -> None:
    """Repair a connection: its name, config, credentials or schedule (or, before its first
    sync, the schema of its typed views).

    What is not given stays as it is."""
    if every is not None and no_schedule:
        fail("give --every or --no-schedule, not both")
    repair = (name, config, credentials, every) != (None, None, None, None) or no_schedule
    if not repair and schema is None:
        fail(
            "nothing to change: give --name, --config, --credentials, --every, --no-schedule "
            "or --schema"
        )
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
        if schema is not None:
            engine.choose_reader_schema(connection_id, schema)
        updated = (
            engine.update_connection(
                connection_id,
                name=name,
                config=patch,
                credentials=creds,
                schedule_every=schedule,
                no_schedule=no_schedule,
            )
            if repair
            else engine.connection(connection_id)
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
            (f"schema {schema}", schema is not None),
        )
        if given
    ]
    line = f"connection {updated.id} {updated.name!r} updated: {', '.join(changed)}"
    if before.status == ConnectionStatus.DISCONNECTED and updated.status == ConnectionStatus.ACTIVE:
        line += "; it is active again"
    stdout().print(line + _schedule_text(updated.schedule_every if every else None))


def _set_status(action: Callable[[Engine], Connection], verb: str) -> Connection:
    with open_engine() as engine:
        c = action(engine)
    stdout().print(f"connection {c.id} {verb} (status {c.status})")
    return c


def resumed_note(c: Connection) -> str:
    """What resuming a connection sets off: a scheduled one is due at once."""
    if c.schedule_every is None:
        return f"it has no schedule: it syncs when asked (`connector-sync sync {c.id}`)"
    every = format_every(c.schedule_every.total_seconds())
    return f"its schedule makes it due now: a worker starts a sync, then one every {every}"


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
    """Resume a paused connection: a scheduled one is due at once (a sync starts), then its
    schedule goes on from now.

    A disconnected one needs new credentials (`connections update CONNECTION --credentials
    @FILE`), or --force to try the refused ones again."""
    if force:
        warn(
            "--force resumes the connection with the credentials the provider refused; unless "
            "they work again, its next sync disconnects it again"
        )
    c = _set_status(lambda engine: engine.resume(connection_id, force=force), "resumed")
    stdout().print(resumed_note(c))


@connections_app.command("delete")
@guarded
def connections_delete(
    connection_id: int = ConnectionArg(), yes: bool = YesOption, as_json: bool = JsonOption
) -> None:
    """Delete a connection and its records; its run history is kept.

    Its queued sync is cancelled and a purge run deletes its records (behind a sync that is
    still running). On a terminal it asks first (--yes does not)."""
    with open_engine() as engine:
        c = engine.connection(connection_id)
        confirm(
            f"Delete connection {c.id} {c.name!r} ({c.provider}) and purge every record it synced?",
            yes=yes,
        )
        purge = engine.delete_connection(connection_id)
    if as_json:
        emit_json(purge.to_json())
        return
    behind = " behind the sync still running" if purge.status == RunStatus.WAITING else ""
    stdout().print(
        f"connection {connection_id} is being deleted: purge run #{purge.id} is "
        f"{purge.status}{behind}"
    )
