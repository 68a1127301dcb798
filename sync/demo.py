"""``connector-sync demo``: the engine at work in under a minute, then proven from the database.

It starts the simulated provider (``connectors.simulated``) in this process and two
``connector-sync worker`` processes, creates a workspace with connections to the provider's two
APIs (providers ``simulated`` and ``simulated_crm``), and drives a short script: first syncs, a
429 with Retry-After, upstream changes and the tombstones they leave, a cancel, and a
delete whose purge drains behind the sync still running. A live view follows every run. At the
end each claim is checked against what the database recorded (runs, attempts, results,
records) and the demo exits non-zero if any did not hold.

Everything goes through the public Python API (``Engine``); the demo's speed comes from its own
``Settings`` (short polls and backoff, tiny batches, see :func:`tuned`), handed to the workers
through the environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from connectors.simulated.server import Simulation, Tenant, start_server
from sync.api import Engine
from sync.base.embedded import data_dir
from sync.base.settings import Settings
from sync.errors import NotFound
from sync.models import Attempt, Run
from sync.vocabulary import ErrorKind, RunKind, RunStatus

DEADLINE = 55.0  # seconds: the demo gives up (and fails) past this
RETRY_AFTER = 3.0  # the simulated 429's Retry-After, longer than the inline wait below

# The demo's tuning: polls, control reads and heartbeats every half second, retries within
# seconds, and batches small enough that progress moves visibly. Defaults stay untouched.
DEMO_TUNING: dict[str, Any] = {
    "poll_interval": 0.5,
    "control_interval": 0.5,
    "heartbeat_interval": 2.0,
    "lease_seconds": 30.0,
    "max_inline_wait": 1.0,
    "backoff_seconds": (1.0, 2.0, 3.0),
    "batch_size": 20,
    "purge_batch_size": 50,
}


@dataclass
class Check:
    claim: str
    ok: bool
    evidence: str


@dataclass
class Cast:
    """The demo's connections and the runs it started, by role."""

    ids: dict[str, int] = field(default_factory=dict)  # connection name -> id
    runs: dict[str, int] = field(default_factory=dict)  # role -> run id
    purge_status_at_delete: str | None = None
    changes: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)


class DemoFailed(Exception):
    pass


def _env_for_workers(settings: Settings, url: str) -> dict[str, str]:
    env = dict(os.environ)
    if settings.database_url:
        env["DATABASE_URL"] = url
    else:  # the same embedded Postgres, found through the home directory
        env.pop("DATABASE_URL", None)
    env["CONNECTOR_SYNC_SCHEMA"] = settings.schema_name
    env["CONNECTOR_SYNC_HOME"] = str(settings.home.expanduser().resolve())
    for name, value in DEMO_TUNING.items():
        text = f"[{', '.join(str(v) for v in value)}]" if isinstance(value, tuple) else str(value)
        env[f"CONNECTOR_SYNC_{name.upper()}"] = text
    return env


class Workers:
    """Two ``connector-sync worker`` processes, stopped with SIGTERM at the end."""

    def __init__(self, settings: Settings, url: str, tag: str, log_dir: Path) -> None:
        self.ids = [f"demo-{tag}-w{n}" for n in (1, 2)]
        self.logs = [log_dir / f"{wid}.log" for wid in self.ids]
        self._procs: list[subprocess.Popen[bytes]] = []
        env = _env_for_workers(settings, url)
        log_dir.mkdir(parents=True, exist_ok=True)
        for wid, log in zip(self.ids, self.logs, strict=True):
            with open(log, "wb") as handle:
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "sync.cli", "worker", "--id", wid],
                        env=env,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )

    def dead(self) -> list[str]:
        return [wid for wid, p in zip(self.ids, self._procs, strict=True) if p.poll() is not None]

    def stop(self, timeout: float = 15.0) -> list[int | None]:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self._procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes


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
        totals = _totals(run)
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


def _totals(run: Run) -> dict[str, int]:
    totals = {"upserted": 0, "unchanged": 0, "tombstoned": 0}
    for result in run.results.values():
        for key in totals:
            totals[key] += int(result.get(key, 0))
    return totals


def _writing(run: Run) -> bool:
    return run.status == RunStatus.RUNNING and run.processed_units > 0


def _overlap(a: Attempt, b: Attempt) -> bool:
    if a.finished_at is None or b.finished_at is None:
        return True  # an attempt still running overlaps everything after its start
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def _simulation() -> tuple[Simulation, dict[str, Tenant]]:
    simulation = Simulation()
    tenants = {
        # name: (size, seed, page delay)
        "acme": simulation.add_tenant("acme", size=120, seed=11, page_delay=0.3),
        "globex": simulation.add_tenant("globex", size=80, seed=12, page_delay=0.25),
        "initech": simulation.add_tenant("initech", size=80, seed=13, page_delay=0.15),
        "hooli": simulation.add_tenant("hooli", size=160, seed=14, page_delay=0.3),
        "umbrella": simulation.add_tenant("umbrella", size=400, seed=15, page_delay=0.4),
    }
    for tenant in tenants.values():
        tenant.configure(retry_after=RETRY_AFTER)
    return simulation, tenants


# Connection name -> (provider, tenant)
CONNECTIONS = {
    "acme-tracker": ("simulated", "acme"),
    "globex-tracker": ("simulated", "globex"),
    "initech-crm": ("simulated_crm", "initech"),
    "hooli-crm": ("simulated_crm", "hooli"),
    "umbrella-crm": ("simulated_crm", "umbrella"),
}


def tuned(settings: Settings) -> Settings:
    """``settings`` with the demo's tuning: open the demo's Engine on these."""
    return settings.model_copy(update=DEMO_TUNING)


def run_demo(engine: Engine, console: Console) -> bool:
    """Run the demo on ``engine`` (opened on :func:`tuned` settings); True if every claim it
    made held."""
    settings = engine.settings
    tag = uuid.uuid4().hex[:6]
    simulation, tenants = _simulation()
    url, stop_server = start_server(simulation)
    workers: Workers | None = None
    cast = Cast()
    checks: list[Check] = []
    try:
        engine.migrate()  # the demo's own schema, or the embedded database
        console.print(
            Text(
                f"simulated provider at {url} · two workers · settings tuned for a "
                "one-minute demo (polls every 0.5s, Retry-After 3s)",
                style="dim",
            )
        )
        workspace = engine.create_workspace(f"demo-{tag}")
        for name, (provider, tenant) in CONNECTIONS.items():
            conn = engine.create_connection(
                workspace.id,
                name,
                provider,
                config={"base_url": url, "tenant": tenant, "page_size": 20},
                credentials={"token": tenants[tenant].token},
            )
            cast.ids[name] = conn.id
        names = {cid: name for name, cid in cast.ids.items()}
        view = View(engine, workspace.id, names, console)
        log_dir = settings.home.expanduser().resolve() / "demo-logs"
        workers = Workers(settings, engine.url, tag, log_dir)
        try:
            with view.showing():
                _script(engine, view, cast, tenants, workers)
        except DemoFailed as exc:
            view.say(f"the demo could not finish: {exc}", style="red")
            checks.append(Check("the demo script finished", False, str(exc)))
        finally:
            _cancel_leftovers(engine, workspace.id)
            codes = workers.stop()
        checks.extend(_verify(engine, workspace.id, cast, tenants, workers, codes))
        _summary(console, checks, workers, settings, workspace.name)
    finally:
        if workers is not None:
            workers.stop(timeout=5)
        stop_server()
    return all(c.ok for c in checks)


def _script(
    engine: Engine, view: View, cast: Cast, tenants: dict[str, Tenant], workers: Workers
) -> None:
    ids = cast.ids

    def run(role: str) -> Run:
        return engine.run(cast.runs[role])

    def ended(*roles: str) -> Callable[[], bool]:
        return lambda: all(run(role).is_terminal for role in roles)

    def check_workers() -> bool:
        dead = workers.dead()
        if dead:
            raise DemoFailed(f"worker {dead[0]} exited; see {workers.logs[0].parent}")
        return True

    view.step("starting two workers")
    view.wait(
        "the workers' first heartbeat",
        lambda: (
            check_workers()
            and {w.id for w in engine.workers() if w.stopped_at is None} >= set(workers.ids)
        ),
    )

    view.step(
        "1. first syncs: two tracker connections (one provider: they must take turns) and a "
        "CRM connection whose provider answers 429 with Retry-After: 3"
    )
    tenants["initech"].script_faults("429")
    tenants["globex"].script_faults("ok", "503")  # one 503, retried inside the request
    for role in ("acme-tracker", "initech-crm", "globex-tracker"):
        cast.runs[f"{role}#1"] = engine.sync(ids[role]).id
    view.wait(
        "the first syncs",
        lambda: check_workers() and ended("acme-tracker#1", "initech-crm#1", "globex-tracker#1")(),
    )

    view.step("2. upstream changes: rows added, updated and deleted at acme and initech")
    for name in ("acme", "initech"):
        tenant = tenants[name]
        cast.changes[name] = tenant.advance()
        summary = ", ".join(
            f"{t} +{len(c['added'])} ~{len(c['updated'])} -{len(c['deleted'])}"
            for t, c in cast.changes[name].items()
            if t in (("projects", "issues") if name == "acme" else ("contacts", "deals"))
        )
        view.say(f"   {name}: {summary}")
    view.step("   resync acme-tracker, and start umbrella-crm's large sync to cancel it")
    cast.runs["acme-tracker#2"] = engine.sync(ids["acme-tracker"]).id
    cast.runs["umbrella-crm#1"] = engine.sync(ids["umbrella-crm"]).id
    view.wait(
        "umbrella-crm's sync to write its first records",
        lambda: (
            run("umbrella-crm#1").status == RunStatus.RUNNING
            and run("umbrella-crm#1").processed_units > 0
        ),
    )
    view.step("3. cancel umbrella-crm's running sync (it keeps what it wrote)")
    engine.cancel_run(cast.runs["umbrella-crm#1"])
    view.wait("the cancel", ended("umbrella-crm#1"))

    view.step("   resync initech-crm: its deals feed reports deletions explicitly")
    cast.runs["initech-crm#2"] = engine.sync(ids["initech-crm"]).id
    view.wait("the resyncs", ended("acme-tracker#2", "initech-crm#2"))

    view.step("4. sync hooli-crm, and delete it while the sync is running")
    cast.runs["hooli-crm#1"] = engine.sync(ids["hooli-crm"]).id
    view.wait(
        "hooli-crm's sync to write records",
        lambda: _writing(run("hooli-crm#1")),
    )
    purge = engine.delete_connection(ids["hooli-crm"])
    cast.runs["purge"] = purge.id
    cast.purge_status_at_delete = purge.status
    view.wait("the purge", ended("hooli-crm#1", "purge"))
    view.step("done: stopping the workers (SIGTERM) and checking every claim in the database")


def _cancel_leftovers(engine: Engine, workspace_id: int) -> None:
    """A demo cut short leaves no sync queued for a provider that is about to stop."""
    for run in engine.runs(workspace_id=workspace_id, limit=200):
        if run.kind == RunKind.SYNC and run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            with contextlib.suppress(Exception):
                engine.cancel_run(run.id)


def _verify(
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
        totals = _totals(second) if second else {"upserted": -1, "tombstoned": -1}
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
    written = _totals(sync_run)["upserted"] if sync_run else -1
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


def _summary(
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
