"""The demo's verdict: every claim it made, checked against what the database recorded (runs,
attempts, results, records, workers), and the table that reports them."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from connectors.simulated.tenants import Tenant
from sync.api import Engine
from sync.base.embedded import data_dir
from sync.base.settings import Settings
from sync.demo.scenario import RETRY_AFTER, Cast
from sync.demo.view import run_totals
from sync.demo.workers import Workers
from sync.errors import NotFound
from sync.models import Attempt, Run
from sync.vocabulary import ErrorKind, RunKind, RunStatus


@dataclass
class Check:
    claim: str
    ok: bool
    evidence: str


def _overlap(a: Attempt, b: Attempt) -> bool:
    if a.finished_at is None or b.finished_at is None:
        return True  # an attempt still running overlaps everything after its start
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def verify(
    engine: Engine,
    workspace_id: int,
    cast: Cast,
    tenants: dict[str, Tenant],
    workers: Workers,
    exit_codes: list[int | None],
) -> list[Check]:
    """Every claim the demo made, checked against the database."""
    checks: list[Check] = []
    runs = {r.id: r for r in engine.runs(workspace_id=workspace_id, limit=200)}
    attempts = {rid: engine.attempts(rid) for rid in runs}
    flat = [(runs[rid], a) for rid, items in attempts.items() for a in items]

    def role(name: str) -> Run | None:
        rid = cast.runs.get(name)
        return runs.get(rid) if rid is not None else None

    def attempts_of(name: str) -> list[Attempt]:
        rid = cast.runs.get(name)
        return attempts.get(rid, []) if rid is not None else []

    # Parallel across providers, serialized within one.
    cross = [
        (ra.id, rb.id)
        for i, (ra, a) in enumerate(flat)
        for rb, b in flat[i + 1 :]
        if ra.provider != rb.provider and RunKind.PURGE not in (ra.kind, rb.kind) and _overlap(a, b)
    ]
    checks.append(
        Check(
            "runs of different providers ran in parallel",
            bool(cross),
            f"{len(cross)} overlapping attempt pair(s), e.g. runs "
            + (f"#{cross[0][0]} and #{cross[0][1]}" if cross else "none"),
        )
    )
    clashes = [
        (ra.id, rb.id)
        for i, (ra, a) in enumerate(flat)
        for rb, b in flat[i + 1 :]
        if ra.id != rb.id
        and (ra.provider == rb.provider or RunKind.PURGE in (ra.kind, rb.kind))
        and _overlap(a, b)
    ]
    same_lane = sum(
        1
        for i, (ra, _) in enumerate(flat)
        for rb, _ in flat[i + 1 :]
        if ra.id != rb.id and ra.provider == rb.provider
    )
    checks.append(
        Check(
            "runs of one provider (and any purge) never overlapped",
            not clashes and same_lane > 0,
            f"0 of {same_lane} same-provider attempt pairs overlapped"
            if not clashes
            else f"runs #{clashes[0][0]} and #{clashes[0][1]} overlapped",
        )
    )

    # The 429 and its Retry-After.
    limited = role("initech-crm#1")
    tries = attempts_of("initech-crm#1")
    ok = (
        limited is not None
        and limited.status == RunStatus.SUCCEEDED
        and len(tries) >= 2
        and tries[0].outcome == "rate_limited"  # a wait: no attempt spent
        and tries[0].error is not None
        and tries[0].error.kind == ErrorKind.RATE_LIMITED
        and tries[0].finished_at is not None
    )
    first_end = tries[0].finished_at if tries else None
    gap = (tries[1].started_at - first_end).total_seconds() if ok and first_end else 0.0
    checks.append(
        Check(
            "a 429 requeued the run and the retry waited for Retry-After",
            ok and gap >= RETRY_AFTER - 0.05 and tenants["initech"].stats.rate_limited >= 1,
            f"run #{limited.id if limited else '?'}: attempt 1 {tries[0].outcome if tries else '-'}"
            f" ({tries[0].error.kind if tries and tries[0].error else '-'}), attempt 2 began "
            f"{gap:.1f}s later (Retry-After {RETRY_AFTER:.0f}s), run "
            f"{limited.status if limited else '-'}",
        )
    )
    globex = role("globex-tracker#1")
    checks.append(
        Check(
            "a 503 was retried inside the request",
            globex is not None
            and globex.status == RunStatus.SUCCEEDED
            and globex.attempts == 1
            and tenants["globex"].stats.unavailable >= 1,
            f"provider sent {tenants['globex'].stats.unavailable} 503(s); run "
            f"#{globex.id if globex else '?'} {globex.status if globex else '-'} in "
            f"{globex.attempts if globex else '?'} attempt(s)",
        )
    )

    # Tombstones: exactly the rows deleted upstream, and unchanged rows not rewritten.
    for name, conn_name, tables in (
        ("acme", "acme-tracker", ("projects", "issues")),
        ("initech", "initech-crm", ("contacts", "deals")),
    ):
        second = role(f"{conn_name}#2")
        changes = cast.changes.get(name, {})
        deleted = sum(len(changes.get(t, {}).get("deleted", [])) for t in tables)
        changed = sum(
            len(changes.get(t, {}).get("added", [])) + len(changes.get(t, {}).get("updated", []))
            for t in tables
        )
        totals = run_totals(second) if second else {"upserted": -1, "tombstoned": -1}
        cid = cast.ids[conn_name]
        stored = [r for r in engine.records(cid, include_deleted=True) if r.table_name in tables]
        tombstoned_rows = sum(1 for r in stored if r.deleted_at is not None)
        checks.append(
            Check(
                f"{conn_name}: upstream deletions became tombstones, unchanged rows untouched",
                second is not None
                and second.status == RunStatus.SUCCEEDED
                and deleted > 0
                and totals["tombstoned"] == deleted == tombstoned_rows
                and totals["upserted"] == changed,
                f"{deleted} deleted upstream → {totals['tombstoned']} tombstoned by run "
                f"#{second.id if second else '?'} ({tombstoned_rows} rows have deleted_at); "
                f"{changed} added/updated → {totals['upserted']} upserted",
            )
        )

    # The cancel.
    cancelled = role("umbrella-crm#1")
    checks.append(
        Check(
            "a running sync was cancelled and kept what it had written",
            cancelled is not None
            and cancelled.status == RunStatus.CANCELLED
            and cancelled.cancel_requested_at is not None
            and cancelled.started_at is not None
            and cancelled.processed_units > 0,
            f"run #{cancelled.id if cancelled else '?'} {cancelled.status if cancelled else '-'}"
            f" with {cancelled.processed_units if cancelled else 0} records written"
            + (
                f"; {len(engine.records(cast.ids['umbrella-crm']))} records kept"
                if cancelled
                else ""
            ),
        )
    )

    # The purge drained behind the sync, then removed everything.
    sync_run, purge_run = role("hooli-crm#1"), role("purge")
    sync_tries, purge_tries = attempts_of("hooli-crm#1"), attempts_of("purge")
    try:
        engine.connection(cast.ids["hooli-crm"])
        gone = False
    except NotFound:
        gone = True
    drained = (
        bool(sync_tries and purge_tries)
        and sync_tries[-1].finished_at is not None
        and purge_tries[0].started_at >= sync_tries[-1].finished_at
    )
    written = run_totals(sync_run)["upserted"] if sync_run else -1
    checks.append(
        Check(
            "delete: the purge waited for the running sync, then removed the connection",
            cast.purge_status_at_delete == "waiting"
            and sync_run is not None
            and sync_run.status == RunStatus.SUCCEEDED
            and purge_run is not None
            and purge_run.status == RunStatus.SUCCEEDED
            and drained
            and gone
            and purge_run.processed_units == written,
            f"purge #{purge_run.id if purge_run else '?'} was "
            f"{cast.purge_status_at_delete}, started after sync #{sync_run.id if sync_run else '?'}"
            f" finished: {drained}; {purge_run.processed_units if purge_run else 0} of "
            f"{written} records purged; connection gone: {gone}",
        )
    )

    # Every run ended, and the workers stopped when told.
    pending = [r.id for r in runs.values() if not r.is_terminal]
    checks.append(
        Check("every run ended", not pending, f"{len(runs)} runs, {len(pending)} not ended")
    )
    info = {w.id: w for w in engine.workers()}
    stopped = [wid for wid in workers.ids if wid in info and info[wid].stopped_at is not None]
    checks.append(
        Check(
            "both workers stopped cleanly on SIGTERM",
            len(stopped) == len(workers.ids) and all(code == 0 for code in exit_codes),
            f"exit codes {exit_codes}; {len(stopped)} recorded stopped_at",
        )
    )
    return checks


def print_summary(
    console: Console, checks: list[Check], workers: Workers, settings: Settings, workspace: str
) -> None:
    table = Table(title="what the demo showed, checked in the database", title_justify="left")
    table.add_column("", no_wrap=True)
    table.add_column("claim")
    table.add_column("evidence")
    for check in checks:
        mark = Text("✓", style="green") if check.ok else Text("✗", style="red bold")
        table.add_row(mark, check.claim, check.evidence)
    console.print(table)
    prefix = ""
    if settings.database_url or settings.schema_name != Settings().schema_name:
        prefix = f"CONNECTOR_SYNC_SCHEMA={settings.schema_name} "
    if all(c.ok for c in checks):
        console.print(Text("every claim held.", style="green bold"))
    else:
        console.print(
            Text(
                f"{sum(not c.ok for c in checks)} claim(s) did not hold; worker logs: "
                f"{workers.logs[0].parent}",
                style="red bold",
            )
        )
    look = [
        Text("look around:", style="dim"),
        Text(f"  {prefix}connector-sync runs list --workspace {workspace}"),
        Text(f"  {prefix}connector-sync runs show RUN"),
        Text(f"  {prefix}connector-sync records list CONNECTION"),
        Text(f"  {prefix}connector-sync schema show CONNECTION"),
        Text(f"  {prefix}connector-sync workers"),
    ]
    if not settings.database_url:
        look.append(
            Text(
                f"the embedded Postgres under {data_dir(settings.home)} keeps running for the "
                "next command; `connector-sync db stop` stops it",
                style="dim",
            )
        )
    console.print(Group(*look))
