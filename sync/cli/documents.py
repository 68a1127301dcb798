"""Documents from the command line: ``ingest PATH`` (index a local file the way a synced one is
indexed, ``--wait`` for a live bar of its chunks), ``search QUERY``, and ``ingestions
list|show|cancel``. Like every command, a thin layer over the Python API."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from sync.api import Engine
from sync.cli.common import (
    INTERRUPTED,
    RUN_FAILED,
    JsonOption,
    WorkspaceOption,
    app,
    brief_error,
    command_group,
    emit_json,
    fail,
    guarded,
    open_engine,
    session,
    stdout,
    worker_state,
    workspace_id,
)
from sync.cli.console import (
    Cell,
    Col,
    details,
    error_text,
    fitted_table,
    retry_when,
    styled,
    when,
)
from sync.documents import SearchHit
from sync.ingestions.models import Ingestion, IngestionKind, IngestionStatus

ingestions_app = command_group(
    "Ingestions: files being made searchable, their progress and errors."
)
app.add_typer(ingestions_app, name="ingestions")

PathsArg = typer.Argument(
    ..., metavar="PATH...", help="Text, Markdown, HTML, PDF or ZIP files, and folders of them."
)
IngestionArg = typer.Argument(..., metavar="INGESTION", min=1, help="An ingestion id.")
DONE = (IngestionStatus.READY, IngestionStatus.SKIPPED)
MAX_MEMBERS = 1000  # the members of an archive listed (the most a listing gives)


def _workspace(engine: Engine, ref: str | None) -> int:
    if ref is None:
        fail("say which workspace: -w WORKSPACE (an id or a name)")
    return workspace_id(engine, ref)


# -- ingest ------------------------------------------------------------------------------------


@app.command("ingest")
@guarded
def ingest_command(
    paths: list[Path] = PathsArg,
    workspace: str | None = WorkspaceOption,
    wait: bool = typer.Option(False, "--wait", help="Follow the ingestions live until they end."),
    as_json: bool = JsonOption,
) -> None:
    """Index local files into WORKSPACE for search: queues an ingestion per file that a worker
    runs (it reads each file on its own machine, so run `connector-sync worker` where they are).
    A folder gives its files and its subfolders' (hidden ones, and files of a type that cannot
    be indexed, are left out)."""
    with open_engine() as engine:
        ws = _workspace(engine, workspace)
        batch = engine.ingest_paths(paths, ws)
        queued = list(batch.ingestions)
        if wait:
            session.announce()
            try:
                if len(queued) == 1:
                    queued = [follow_ingestion(engine, queued[0], live=not as_json)]
                else:
                    queued = follow_ingestions(engine, queued, live=not as_json)
            except KeyboardInterrupt:
                print(
                    "stopped following; the ingestions go on (`connector-sync ingestions cancel "
                    "ID` stops one)",
                    file=sys.stderr,
                )
                raise typer.Exit(INTERRUPTED) from None
            members = [
                m for i in queued for m in engine.ingestions(archive_id=i.id, limit=MAX_MEMBERS)
            ]
    one_file = len(paths) == 1 and paths[0].is_file()
    if as_json:
        ingestions = [i.to_json() for i in queued]
        skipped = [str(p) for p in batch.skipped]
        emit_json(ingestions[0] if one_file else {"ingestions": ingestions, "skipped": skipped})
    elif not wait:
        out = stdout()
        for i in queued:
            verb = "queued" if i.attempts == 0 else f"already {i.status}"
            out.print(Text(f"ingestion #{i.id} {verb}: {i.source_text}", overflow="fold"))
    if batch.skipped and not as_json:
        names = ", ".join(p.name for p in batch.skipped[:5])
        more = f" and {len(batch.skipped) - 5} more" if len(batch.skipped) > 5 else ""
        stdout().print(
            Text(
                f"left out {len(batch.skipped)} file(s) of a type that cannot be indexed: "
                f"{names}{more}",
                overflow="fold",
            )
        )
    if wait and not all(_succeeded(i, members) for i in queued):
        raise typer.Exit(RUN_FAILED)


def follow_ingestions(
    engine: Engine, queued: list[Ingestion], *, live: bool, interval: float = 0.5
) -> list[Ingestion]:
    """Poll several ingestions until each has ended (an archive, with its members), with a bar
    of the files ended; then the table of them. Returns them as they ended."""
    out = stdout()
    progress = Progress(
        TextColumn("[bold]ingestions"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("files ended"),
        console=out,
    )
    task = progress.add_task("ingest", total=len(queued))
    current = {i.id: i for i in queued}
    display = (
        Live(progress, console=out, refresh_per_second=4) if live and out.is_terminal else None
    )
    with display or contextlib.nullcontext():
        while True:
            for i in list(current.values()):
                if not _ended(engine, i):
                    current[i.id] = engine.ingestion(i.id)
            ended = sum(_ended(engine, i) for i in current.values())
            progress.update(task, completed=ended)
            if ended == len(current):
                break
            time.sleep(interval)
    if live:
        done = list(current.values())
        out.print(ingestions_table(done, out.width))
        ready = sum(i.status in DONE for i in done)
        out.print(f"{ready} of {len(done)} ingestion(s) ready")
    return list(current.values())


def _ended(engine: Engine, ingestion: Ingestion) -> bool:
    if not ingestion.is_terminal:
        return False
    if ingestion.kind is IngestionKind.ARCHIVE and ingestion.status is IngestionStatus.READY:
        members = engine.ingestions(archive_id=ingestion.id, limit=MAX_MEMBERS)
        return all(m.is_terminal for m in members)
    return True


def _succeeded(ingestion: Ingestion, members: list[Ingestion]) -> bool:
    mine = [m for m in members if m.archive_id == ingestion.id]
    return ingestion.status in DONE and all(m.status in DONE for m in mine)


def describe_ingestion(
    ingestion: Ingestion, *, workers_alive: int | None, now: datetime, countdown: bool = True
) -> str:
    """One line about where an ingestion is; pure, for the live view and `ingestions show`.
    Without ``countdown`` a retry says when it starts (output without a terminal prints a line
    each time this one changes)."""
    i = ingestion
    if i.status is IngestionStatus.QUEUED:
        if i.attempts > 0 and i.queued_at > now:
            why = brief_error(i.error, 60)
            text = (
                f"retrying {retry_when(i.queued_at, now, countdown=countdown)} "
                f"(attempt {i.attempts + 1} of {i.max_attempts})"
            )
            return text + (f" after {why}" if why else "")
        if workers_alive == 0:
            return "queued; no worker is running: start one with `connector-sync worker`"
        where = f", resumes at chunk {i.processed_units:,}" if i.processed_units else ""
        return f"queued, waiting for a worker{where}"
    if i.status is IngestionStatus.RUNNING:
        if i.kind is IngestionKind.ARCHIVE:
            since = when(i.processing_since)
            return (
                f"expanding the archive (attempt {i.attempts} of {i.max_attempts}, since {since})"
            )
        text = f"running attempt {i.attempts} of {i.max_attempts}"
        if i.total_units is not None:
            text += f": {i.processed_units:,} of {i.total_units:,} chunks"
        else:
            text += ": fetching and counting"
        if i.cancel_requested_at is not None:
            text += ", cancel requested"
        return text
    error = error_text(i.error, status=i.status.value)
    if i.kind is IngestionKind.ARCHIVE and i.status is IngestionStatus.READY:
        return f"ready: expanded into {i.results.get('members', 0)} member file(s)"
    if i.status is IngestionStatus.READY:
        chunks = i.total_units if i.total_units is not None else i.processed_units
        if i.results.get("reused"):
            return f"ready: unchanged, its {chunks:,} chunks were indexed already"
        return f"ready: {chunks:,} chunks"
    return i.status.value + (f": {error}" if error else "")


def follow_ingestion(
    engine: Engine, ingestion: Ingestion, *, live: bool, interval: float = 0.5
) -> Ingestion:
    """Poll the ingestion (and, for an archive, its members) until it ends, with a bar of
    processed_units / total_units. Returns the final ingestion."""
    out = stdout()
    progress = Progress(
        TextColumn("[bold]ingestion #{task.fields[id]}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        console=out,
    )
    task = progress.add_task("ingest", total=None, id=ingestion.id, unit="chunks")
    interactive = live and out.is_terminal
    display = Live(console=out, refresh_per_second=8) if interactive else None
    checked_workers_at = 0.0
    alive: int | None = None
    last_line = ""
    with display or contextlib.nullcontext():
        while True:
            ingestion = engine.ingestion(ingestion.id)
            members: list[Ingestion] = []
            if (
                ingestion.kind is IngestionKind.ARCHIVE
                and ingestion.status is IngestionStatus.READY
            ):
                members = engine.ingestions(archive_id=ingestion.id, limit=MAX_MEMBERS)
            if time.monotonic() - checked_workers_at > 5:
                checked_workers_at = time.monotonic()
                alive = sum(worker_state(w, engine.settings) == "alive" for w in engine.workers())
            line = describe_ingestion(
                ingestion, workers_alive=alive, now=datetime.now(UTC), countdown=interactive
            )
            if members:
                ended = sum(m.is_terminal for m in members)
                progress.update(task, completed=ended, total=len(members), unit="member files")
                line += f"; {ended} of {len(members)} indexed"
            else:
                progress.update(
                    task,
                    completed=ingestion.processed_units,
                    total=ingestion.total_units,
                    unit="chunks",
                )
            if display is not None:
                display.update(Group(progress, Text(f"  {line}", overflow="fold")))
            elif live and line != last_line:
                out.print(f"ingestion #{ingestion.id}: {line}")
            last_line = line
            if ingestion.is_terminal and all(m.is_terminal for m in members):
                break
            time.sleep(interval)
    if live:
        _print_end(out, ingestion, members)
    return ingestion


def _print_end(out: Console, ingestion: Ingestion, members: list[Ingestion]) -> None:
    if members:
        out.print(ingestions_table(members, out.width, title="member files"))
    line = describe_ingestion(ingestion, workers_alive=None, now=datetime.now(UTC))
    out.print(Text(f"ingestion #{ingestion.id} {line}", overflow="fold"))


# -- search ------------------------------------------------------------------------------------


@app.command("search")
@guarded
def search_command(
    query: str = typer.Argument(..., metavar="QUERY", help="Words to look for."),
    workspace: str | None = WorkspaceOption,
    limit: int = typer.Option(10, "--limit", metavar="N", min=1, max=1000),
    as_json: bool = JsonOption,
) -> None:
    """The chunks of WORKSPACE's documents that best match QUERY, best first, each with its
    file, page and score (0 to 1: the query's words it holds, weighed by their rarity, and its
    vector's similarity). Documents embedded by another model than the configured one are
    matched by their words only; a line on stderr says so."""
    with open_engine() as engine:
        hits = engine.search(query, _workspace(engine, workspace), limit=limit)
    if hits.notice:
        print(f"note: {hits.notice}", file=sys.stderr, flush=True)
    if as_json:
        emit_json([{**asdict(h), "file": hit_file(h)} for h in hits])
        return
    out = stdout()
    if not hits:
        out.print("no matches")
        return
    for rank, hit in enumerate(hits, start=1):
        title = Text(f"{rank}. {hit_file(hit)}", style="bold")
        title.append(f"  page {hit.page}, chunk {hit.chunk_index}, score {hit.score:.4f}", "dim")
        out.print(title)
        snippet = " ".join(hit.text.split())
        snippet = snippet if len(snippet) <= 230 else snippet[:229] + "…"
        out.print(Padding(Text(snippet, overflow="fold"), (0, 0, 0, 3)))


def hit_file(hit: SearchHit) -> str:
    name = hit.document_name
    return f"{name} ({hit.member_path})" if hit.member_path else name


# -- ingestions list | show | cancel -----------------------------------------------------------


def progress_text(i: Ingestion) -> str:
    if i.kind is IngestionKind.ARCHIVE:
        members = i.results.get("members")
        return f"{members} files" if members is not None else "-"
    if i.total_units is None:
        return "-"
    return f"{i.processed_units:,}/{i.total_units:,}"


def ingestions_table(found: list[Ingestion], width: int, title: str | None = None) -> Table:
    columns = [
        Col("ingestion", key=True),
        Col("status", key=True),
        Col("file", text="ellipsis"),
        Col("chunks", keep=6, justify="right"),
        Col("kind", keep=2),
        Col("tries", keep=4, justify="right"),
        Col("queued", keep=3),
        Col("error", text="ellipsis", keep=5),
    ]
    rows: list[list[Cell]] = [
        [
            f"#{i.id}",
            styled(i.status.value),
            i.file,
            progress_text(i),
            i.kind.value,
            f"{i.attempts}/{i.max_attempts}",
            when(i.queued_at, seconds=False),
            error_text(i.error, status=i.status.value),
        ]
        for i in found
    ]
    return fitted_table(columns, rows, width, title=title)


@ingestions_app.command("list")
@guarded
def ingestions_list(
    workspace: str | None = WorkspaceOption,
    status: str | None = typer.Option(
        None, "--status", "-s", metavar="STATUS", help="queued, running, ready, failed..."
    ),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=1000),
    as_json: bool = JsonOption,
) -> None:
    """Recent ingestions, newest first."""
    with open_engine() as engine:
        ws = workspace_id(engine, workspace) if workspace else None
        found = engine.ingestions(workspace_id=ws, status=status, limit=limit)
    if as_json:
        emit_json([i.to_json() for i in found])
        return
    out = stdout()
    out.print(ingestions_table(found, out.width) if found else "no ingestions")


@ingestions_app.command("show")
@guarded
def ingestions_show(ingestion_id: int = IngestionArg, as_json: bool = JsonOption) -> None:
    """An ingestion: its file, state, progress, attempts and lease, and its error in full."""
    with open_engine() as engine:
        i = engine.ingestion(ingestion_id)
        members = (
            engine.ingestions(archive_id=i.id, limit=1000)
            if i.kind is IngestionKind.ARCHIVE
            else []
        )
        alive = (
            None
            if i.is_terminal
            else sum(worker_state(w, engine.settings) == "alive" for w in engine.workers())
        )
    if as_json:
        emit_json({**i.to_json(), "members": [m.to_json() for m in members]})
        return
    out = stdout()
    rows: list[tuple[str, Cell]] = [
        ("ingestion", f"#{i.id} ({i.kind.value}, workspace {i.workspace_id})"),
        ("file", i.name or "-"),
        ("source", i.source_text),
        ("scope", i.scope or "-"),
        ("status", styled(i.status.value)),
        ("attempts", f"{i.attempts} of {i.max_attempts}"),
    ]
    if i.kind is IngestionKind.DOCUMENT:
        total = "?" if i.total_units is None else f"{i.total_units:,}"
        rows.append(("chunks", f"{i.processed_units:,} of {total} embedded and stored"))
        if i.results.get("reused"):
            rows.append(("unchanged", "indexed already: nothing was embedded again"))
        if i.indexed_with:
            rows.append(("embedded by", i.indexed_with))
        if "pages" in i.results:
            pages = f"{i.results['pages']}"
            if i.results.get("skipped_pages"):
                pages += f", {i.results['skipped_pages']} without text (skipped; no OCR)"
            rows.append(("pages", pages))
    else:
        rows.append(("members", f"{i.results.get('members', '-')} file(s)"))
    if i.archive_id:
        rows.append(("archive", f"ingestion #{i.archive_id}"))
    if i.document_id:
        rows.append(("document", str(i.document_id)))
    rows += [
        ("queued", when(i.queued_at)),
        ("started", when(i.started_at)),
        ("finished", when(i.finished_at)),
    ]
    if i.status is IngestionStatus.RUNNING:
        if i.kind is IngestionKind.ARCHIVE:
            rows.append(("processing since", when(i.processing_since)))
        else:
            rows.append(("lease owner", str(i.lease_owner)))
            rows.append(("lease expires", when(i.lease_expires_at)))
        rows.append(("worker", i.worker_id or "-"))
    if i.cancel_requested_at:
        rows.append(("cancel requested", when(i.cancel_requested_at)))
    if i.error:
        rows.append(("error", error_text(i.error, status=i.status.value)))
    if not i.is_terminal:
        now = datetime.now(UTC)
        rows.append(("now", describe_ingestion(i, workers_alive=alive, now=now)))
    out.print(details(rows))
    if members:
        out.print(ingestions_table(members, out.width, title="member files"))


@ingestions_app.command("reindex")
@guarded
def ingestions_reindex(workspace: str | None = WorkspaceOption, as_json: bool = JsonOption) -> None:
    """Index WORKSPACE's files again whose documents were embedded by another model, or cut
    with other chunk settings, than this process's settings give (after the embedder was
    changed). Each document leaves search while a worker indexes it again."""
    with open_engine() as engine:
        ws = _workspace(engine, workspace)
        queued = engine.reindex(ws)
    if as_json:
        emit_json({"workspace_id": ws, "queued": queued})
    elif queued:
        stdout().print(f"{queued} file(s) queued to be indexed again")
    else:
        stdout().print("every document is indexed with the configured embedder and chunks")


@ingestions_app.command("cancel")
@guarded
def ingestions_cancel(ingestion_id: int = IngestionArg, as_json: bool = JsonOption) -> None:
    """Cancel a queued ingestion at once, or ask a running one to stop (within one batch)."""
    with open_engine() as engine:
        i = engine.cancel_ingestion(ingestion_id)
    if as_json:
        emit_json(i.to_json())
    elif i.status is IngestionStatus.CANCELLED:
        stdout().print(f"ingestion #{i.id} cancelled")
    else:
        stdout().print(f"ingestion #{i.id} is running: its worker was asked to stop it")
