"""The demo's scenario: the simulated provider's tenants and the connections to them, the
settings tuned for a one-minute demo, and the script it plays (first syncs, a 429 with
Retry-After, upstream changes and their tombstones, a cancel, and a delete whose purge drains
behind the sync still running), recording in a :class:`Cast` the runs it started."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectors.simulated.tenants import Simulation, Tenant
from sync.api import Engine
from sync.base.settings import Settings
from sync.demo.view import DemoFailed, View
from sync.demo.workers import Workers
from sync.models import Run
from sync.vocabulary import RunKind, RunStatus

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
class Cast:
    """The demo's connections and the runs it started, by role."""

    ids: dict[str, int] = field(default_factory=dict)  # connection name -> id
    runs: dict[str, int] = field(default_factory=dict)  # role -> run id
    purge_status_at_delete: str | None = None
    changes: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)


def _writing(run: Run) -> bool:
    return run.status == RunStatus.RUNNING and run.processed_units > 0


def simulated_provider() -> tuple[Simulation, dict[str, Tenant]]:
    """The provider the demo serves: five tenants of different sizes and speeds, whose 429s
    ask for :data:`RETRY_AFTER` seconds."""
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


def play(
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


def cancel_leftovers(engine: Engine, workspace_id: int) -> None:
    """A demo cut short leaves no sync queued for a provider that is about to stop."""
    for run in engine.runs(workspace_id=workspace_id, limit=200):
        if run.kind == RunKind.SYNC and run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            with contextlib.suppress(Exception):
                engine.cancel_run(run.id)
