"""Chaos run: real worker processes, real faults, a real Postgres of its own, then a reckoning.

    python -m bench.chaos            # short mode (CI): about two minutes in all
    python -m bench.chaos --long     # ten minutes of faults

It starts a Postgres instance on a spare port (so restarting it disturbs nothing else), the
simulated provider with latency, random 429s and 503s and data that changes between syncs,
hundreds of connections on short schedules across several workspaces and two providers, and
six or more `connector-sync worker` processes, each reaching Postgres through a TCP proxy of
its own and started again, as a supervisor would, if it exits. While they work, a fault
injector, at random: SIGKILLs a worker and starts a new one; SIGSTOPs a worker past its lease
and later SIGCONTs it; restarts Postgres (once in short mode, three times in long mode); cuts
a worker off from Postgres for longer than a lease, then lets it reconnect; cancels runs and
deletes connections mid-sync. Restarts alternate a crash (immediate shutdown, which empties the
unlogged seen-keys table) and a clean stop. Tables are read in pages of a few rows, so the
faults land mid-table and later attempts resume them. Beside the syncs, every worker runs
application jobs in lanes (bench/chaos_app.py: slow handlers that fail now and then, on a
standard and an exclusive queue), sent throughout the faults, and ingests, in its ingestion
lane, the files that the connections of every sixth tenant sync from the simulated document
store (bench/chaos_ingestions.py). Then the faults stop, every connection gets a last clean
sync, every job and ingestion is let finish, and the run checks and prints what must be zero:
for the jobs, none lost, none completed twice, no attempt completed past its expiry, none left
active; for the ingestions, none lost, no batch embedded more than once past the one allowed,
no chunk past a document's tail, no request sent inside a provider's window a worker had
recorded. Exit status 1 if any of it is not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from cryptography.fernet import Fernet
from rich.console import Console
from rich.table import Table

from bench import chaos_app
from bench import chaos_ingestions as ingestions
from bench.common import PrivatePostgres, add_json_option, machine_info, print_json
from connectors.simulated.server import Simulation, start_server
from sync import Engine, Settings

console = Console(stderr=True)


@dataclass(frozen=True)
class Plan:
    duration: float  # seconds of faults
    workers: int
    workspaces: int
    connections: int
    tenants: int
    fault_every: float  # mean seconds between faults
    min_each: int  # every kind of fault fires at least this often
    lease: float = 5.0


SHORT = Plan(
    duration=50, workers=6, workspaces=4, connections=120, tenants=12, fault_every=2.0, min_each=1
)
LONG = Plan(
    duration=600, workers=8, workspaces=8, connections=400, tenants=40, fault_every=4.0, min_each=3
)

FAULTS = ("kill", "stop", "cut", "cancel", "delete", "restart")

AUDIT = """
CREATE TABLE chaos_audit (
    written_by uuid, connection_id bigint, op text, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_audit_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_audit (written_by, connection_id, op)
    VALUES (NEW.written_by, NEW.connection_id, TG_OP);
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON records
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_write();
"""

# Every check below must come out zero.
CHECKS = {
    "runs lost (not finished after the drain)": """
        SELECT count(*) FROM connection_runs
         WHERE status NOT IN ('succeeded', 'partial', 'failed', 'cancelled')""",
    "runs with more attempts than allowed": """
        SELECT count(*) FROM connection_runs WHERE attempts > max_attempts""",
    "overlapping leases on one connection": """
        SELECT count(*) FROM run_attempts a JOIN connection_runs ra ON ra.id = a.run_id
          JOIN run_attempts b ON b.id > a.id JOIN connection_runs rb ON rb.id = b.run_id
         WHERE ra.connection_id = rb.connection_id
           AND a.started_at < coalesce(b.finished_at, now())
           AND b.started_at < coalesce(a.finished_at, now())""",
    "writes committed after the writer's lease was lost": """
        SELECT count(*) FROM chaos_audit w
          JOIN run_attempts a ON a.lease_owner = w.written_by
         WHERE w.at > a.finished_at
            OR EXISTS (SELECT 1 FROM run_attempts b
                        WHERE b.run_id = a.run_id AND b.id > a.id AND w.at >= b.started_at)""",
    "provider-limiter violations": """
        WITH held AS (
            -- While an attempt held its run: a lost attempt (its worker died or froze) held it
            -- until its lease ran out, not until the claim that took the run over, which may
            -- come much later (the lane busy, the run's rate budget blocked).
            SELECT a.id, r.workspace_id, r.kind, r.provider, a.started_at,
                   CASE WHEN a.outcome = 'lost'
                        THEN least(a.finished_at,
                                   coalesce(a.lease_expires_at, a.started_at + %(lease)s))
                        ELSE coalesce(a.finished_at, now()) END AS ended_at
              FROM run_attempts a JOIN connection_runs r ON r.id = a.run_id
        )
        SELECT count(*) FROM held a
          JOIN held b ON b.id > a.id AND b.workspace_id = a.workspace_id
         WHERE (a.kind = 'purge' OR b.kind = 'purge' OR a.provider = b.provider)
           AND a.started_at < b.ended_at AND b.started_at < a.ended_at""",
}

# The application jobs the workers ran beside their syncs: each must come out zero too.
JOB_CHECKS = {
    "app jobs lost (sent, not finished after the drain)": """
        SELECT count(*) FROM unnest(%(sent)s::bigint[]) s(id)
         WHERE NOT EXISTS (SELECT 1 FROM jobs j
                            WHERE j.id = s.id AND j.status IN ('completed', 'dead'))""",
    "app jobs completed twice": """
        SELECT count(*) FROM (SELECT job_id FROM job_attempts WHERE outcome = 'completed'
                               GROUP BY job_id HAVING count(*) > 1) twice""",
    "app attempts that completed past their expiry": """
        SELECT count(*) FROM job_attempts
         WHERE outcome = 'completed' AND finished_at > started_at + %(expire)s""",
    "app jobs still active after the drain": """
        SELECT count(*) FROM jobs WHERE status = 'active'""",
}

JOB_FIGURES = {
    "app jobs sent": "SELECT count(*) FROM jobs",
    "app jobs completed": "SELECT count(*) FROM jobs WHERE status = 'completed'",
    "app jobs dead (out of attempts)": "SELECT count(*) FROM jobs WHERE status = 'dead'",
    "app attempts failed by their handler": """
        SELECT count(*) FROM job_attempts WHERE outcome = 'failed'""",
    "app attempts taken back after their expiry": """
        SELECT count(*) FROM job_attempts WHERE outcome = 'expired'""",
}

FIGURES = {
    "runs created": "SELECT count(*) FROM connection_runs",
    "runs succeeded": "SELECT count(*) FROM connection_runs WHERE status = 'succeeded'",
    "runs partial / failed (dead-lettered)": """
        SELECT count(*) FROM connection_runs WHERE status IN ('partial', 'failed')""",
    "runs cancelled": "SELECT count(*) FROM connection_runs WHERE status = 'cancelled'",
    "attempts": "SELECT count(*) FROM run_attempts",
    "attempts lost to a dead or frozen worker": """
        SELECT count(*) FROM run_attempts WHERE outcome = 'lost'""",
    "attempts handed back at shutdown": """
        SELECT count(*) FROM run_attempts WHERE outcome = 'handed_back'""",
    "waits for a rate limit (no attempt spent)": """
        SELECT count(*) FROM run_attempts WHERE outcome = 'rate_limited'""",
    "records written (audited writes)": "SELECT count(*) FROM chaos_audit",
    "purges succeeded": """
        SELECT count(*) FROM connection_runs WHERE kind = 'purge' AND status = 'succeeded'""",
}


class Proxy:
    """A loopback TCP proxy in front of Postgres for one worker. ``cut()`` stops every byte
    both ways (a partition: the worker's statements hang); ``heal()`` drops the connections
    that lived through the cut, as a NAT or firewall would, so the worker must reconnect."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.open = threading.Event()
        self.open.set()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self.open.wait()
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                self.open.wait()  # bytes read just before a cut wait for the heal
                dst.sendall(data)
        except (OSError, ValueError):  # the other direction closed the sockets
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *sockets: socket.socket) -> None:
        for s in sockets:
            with self._lock:
                self._sockets.discard(s)
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        with self._lock:
            survivors = list(self._sockets)
        self._drop(*survivors)
        self.open.set()

    def close(self) -> None:
        self._closed = True
        self.heal()
        self.listener.close()


@dataclass
class Slot:
    """One worker position: its proxy and the process currently in it."""

    index: int
    proxy: Proxy
    process: subprocess.Popen[bytes] | None = None
    generation: int = 0
    stopped: bool = False


@dataclass
class Fleet:
    postgres: PrivatePostgres
    root: Path
    env: dict[str, str]
    slots: list[Slot] = field(default_factory=list)

    def spawn(self, slot: Slot) -> None:
        slot.generation += 1
        log = (self.root / f"worker-{slot.index}-{slot.generation}.log").open("wb")
        env = {
            **self.env,
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{slot.proxy.port}/postgres",
        }
        slot.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sync.cli",
                "worker",
                "--id",
                f"chaos-{slot.index}-{slot.generation}",
                "--app",
                "bench.chaos_app:setup",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        slot.stopped = False

    def start(self, count: int) -> None:
        for i in range(count):
            slot = Slot(i, Proxy(self.postgres.port))
            self.slots.append(slot)
            self.spawn(slot)

    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.process is not None and s.process.poll() is None]

    def supervise(self) -> int:
        """Start a new worker in every slot whose worker exited (a worker that cannot reach
        Postgres when it starts exits with one line, as it should; a supervisor such as systemd
        starts it again). Returns how many were started."""
        exited = [s for s in self.slots if s.process is not None and s.process.poll() is not None]
        for slot in exited:
            self.spawn(slot)
        return len(exited)

    def wait_registered(self, engine: Engine, timeout: float) -> None:
        """Wait until every slot's current worker has registered itself."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = [f"chaos-{s.index}-{s.generation}" for s in self.slots]
            with engine.pool.connection() as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM workers WHERE id = ANY(%s)", (ids,)
                ).fetchone()
            if row and row["n"] == len(ids):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the workers did not start within {timeout:.0f} s")

    def stop_all(self) -> None:
        for slot in self.slots:
            if slot.process is None:
                continue
            if slot.stopped:
                slot.process.send_signal(signal.SIGCONT)
            slot.proxy.heal()
            slot.process.terminate()
        for slot in self.slots:
            if slot.process is not None:
                try:
                    slot.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    slot.process.kill()
            slot.proxy.close()


class Chaos:
    def __init__(self, plan: Plan, seed: int, root: Path) -> None:
        self.plan = plan
        self.random = random.Random(seed)
        self.root = root
        self.fired: Counter[str] = Counter()
        self.respawned = 0  # workers that exited by themselves and were started again
        self.deleted: list[int] = []
        self.postgres = PrivatePostgres(root)
        self.simulation = Simulation()
        self.stop_server: Callable[[], None] = lambda: None
        self.last_restart = -float("inf")
        self.faults_began = 0.0
        self.timers: list[threading.Timer] = []
        self.sent: set[int] = set()  # application jobs sent
        self.crashes: list[float] = []  # when Postgres was stopped with -m immediate
        self.resumes: list[float] = []  # when a frozen worker was let go on
        self.embeddings = ingestions.EmbeddingEndpoint()
        self.url = ""  # the simulated provider's

    # -- setup -----------------------------------------------------------------------------

    def settings(self) -> Settings:
        return Settings(
            database_url=self.postgres.url,
            secret_keys=self.key,
            lease_seconds=self.plan.lease,
            control_interval=0.5,
            heartbeat_interval=2.0,
            poll_interval=0.5,
            # Small batches, so that most of a table's batches are written in the background
            # while the next is read: the faults then land with a batch in flight.
            batch_size=4,
            backoff_seconds=(0.5, 1.0, 2.0),
            max_inline_wait=2.0,
            statement_timeout=20.0,
            lock_timeout=5.0,
            embeddings_url=self.embeddings.url,
            **ingestions.settings(),
        )

    def setup(self) -> Engine:
        self.key = Fernet.generate_key().decode()
        self.postgres.init()
        self.postgres.start()
        engine = Engine(self.settings(), pool_size=6)
        engine.migrate()
        with engine.pool.connection() as conn:
            conn.execute(AUDIT)
            conn.execute(ingestions.AUDIT)
        chaos_app.declare(engine.queues)
        for t in range(self.plan.tenants):
            tenant = self.simulation.add_tenant(f"t{t}", size=30, seed=t, page_delay=0.01)
            # Half the tenants ask for waits longer than a run sleeps inline: those runs wait
            # in the queue, spending no attempt.
            tenant.configure(
                rate_limit_every=17, unavailable_every=23, retry_after=1.0 if t % 2 else 3.0
            )
        url, self.stop_server = start_server(self.simulation)
        self.url = url
        workspaces = [engine.create_workspace(f"ws{w}") for w in range(self.plan.workspaces)]
        for c in range(self.plan.connections):
            tenant = f"t{c % self.plan.tenants}"
            provider = "simulated" if c % 2 == 0 else "simulated_crm"
            if ingestions.is_docs(c, self.plan.tenants):
                provider = "simulated_docs"  # its files are ingested too
            engine.create_connection(
                workspaces[c % len(workspaces)].id,
                f"c{c}",
                provider,
                config={"base_url": url, "tenant": tenant, "page_size": 5},
                credentials={"token": f"sim-{tenant}"},
                schedule_every=self.random.uniform(3, 8),
            )
        return engine

    # -- faults ----------------------------------------------------------------------------

    def inject(self, engine: Engine, fleet: Fleet) -> None:
        self.faults_began = time.monotonic()
        deadline = self.faults_began + self.plan.duration
        next_advance = time.monotonic()
        while time.monotonic() < deadline:
            self.respawned += fleet.supervise()
            if time.monotonic() >= next_advance:
                for tenant in self.random.sample(self.simulation.tenants(), 3):
                    tenant.advance()
                next_advance = time.monotonic() + 2.0
            try:
                self.send_jobs(engine)
            except Exception as exc:  # the database may be restarting; the run goes on
                console.print(f"[yellow]sending jobs failed: {exc}")
            left = [f for f in FAULTS if self.fired[f] < self.plan.min_each]
            remaining = deadline - time.monotonic()
            kind = (
                self.random.choice(left)
                if left and remaining < self.plan.duration / 2
                else self.random.choice(FAULTS)
            )
            try:
                self.fire(kind, engine, fleet)
            except Exception as exc:  # the database may be restarting; the run goes on
                console.print(f"[yellow]{kind} failed: {exc}")
            time.sleep(self.random.expovariate(1 / self.plan.fault_every))

    def fire(self, kind: str, engine: Engine, fleet: Fleet) -> None:
        lease = self.plan.lease
        candidates = [s for s in fleet.live() if not s.stopped and s.proxy.open.is_set()]
        if kind == "kill" and candidates:
            slot = self.random.choice(candidates)
            assert slot.process is not None
            slot.process.send_signal(signal.SIGKILL)
            slot.process.wait()
            fleet.spawn(slot)
        elif kind == "stop" and candidates:
            slot = self.random.choice(candidates)
            assert slot.process is not None
            slot.process.send_signal(signal.SIGSTOP)
            slot.stopped = True
            self.later(lease + 2, lambda s=slot: self._resume(s))
        elif kind == "cut" and candidates:
            slot = self.random.choice(candidates)
            slot.proxy.cut()
            self.later(lease + 2, slot.proxy.heal)
        elif kind == "restart":
            # As often as the mode requires, and never twice within a sixth of the run, so
            # the workers spend the run working between restarts rather than reconnecting.
            if self.fired[kind] >= self.plan.min_each:
                return
            if time.monotonic() - self.last_restart < self.plan.duration / 6:
                return
            # Not in the first fifth either: by then most connections resync (rows unchanged,
            # keys in run_seen_keys) rather than write their first rows, so a crash has seen
            # keys to lose.
            if time.monotonic() - self.faults_began < self.plan.duration / 5:
                return
            self.last_restart = time.monotonic()
            # The first restart is a crash (immediate shutdown), the next a clean one, in turn.
            crash = self.fired[kind] % 2 == 0
            if crash:
                self.crashes.append(time.time())
            self.postgres.restart("immediate" if crash else "fast")
        elif kind == "cancel":
            running = engine.runs(status="running", limit=200)
            syncs = [r for r in running if r.kind == "sync"]
            if not syncs:
                return
            engine.cancel_run(self.random.choice(syncs).id)
        elif kind == "delete":
            running = [
                r
                for r in engine.runs(status="running", limit=200)
                if r.kind == "sync" and r.connection_id not in self.deleted
            ]
            if not running:
                return
            victim = self.random.choice(running).connection_id
            assert victim is not None
            engine.delete_connection(victim)
            self.deleted.append(victim)
        else:
            return
        self.fired[kind] += 1

    def send_jobs(self, engine: Engine) -> None:
        """A few application jobs: standard ones, and keyed ones of which some find their key
        pending (the send returns that job)."""
        for _ in range(8):
            self.sent.add(engine.queues.send(chaos_app.STANDARD, {"n": len(self.sent)}))
        for _ in range(2):
            key = f"key-{self.random.randrange(5)}"
            self.sent.add(engine.queues.send(chaos_app.EXCLUSIVE, {"key": key}, key=key))

    def later(self, seconds: float, action: Callable[[], object]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def _resume(self, slot: Slot) -> None:
        if slot.process is not None and slot.process.poll() is None:
            if slot.stopped:
                self.resumes.append(time.time())
            slot.process.send_signal(signal.SIGCONT)
        slot.stopped = False

    # -- the reckoning ---------------------------------------------------------------------

    def settle(self, engine: Engine, fleet: Fleet) -> None:
        """Stop the faults, heal everything, and give every connection a last clean sync."""
        for timer in self.timers:
            timer.cancel()
        for slot in fleet.slots:
            self._resume(slot)
            slot.proxy.heal()
            if slot.process is None or slot.process.poll() is not None:
                fleet.spawn(slot)
        for tenant in self.simulation.tenants():
            tenant.configure(rate_limit_every=None, unavailable_every=None)
        with engine.pool.connection() as conn:
            conn.execute("UPDATE connections SET next_run_at = NULL")  # schedules off
        self.wait_idle(engine, 180)
        for connection in engine.connections():
            if connection.status == "active":
                engine.sync(connection.id, trigger="clean")
        self.wait_idle(engine, 180)

    @staticmethod
    def wait_idle(engine: Engine, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with engine.pool.connection() as conn:
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM connection_runs "
                    "         WHERE status IN ('waiting', 'queued', 'running')) "
                    "     + (SELECT count(*) FROM jobs "
                    "         WHERE status IN ('queued', 'retrying', 'active')) "
                    "     + (SELECT count(*) FROM ingestions "
                    "         WHERE status IN ('queued', 'running')) AS n"
                ).fetchone()
            if row and row["n"] == 0:
                return
            time.sleep(0.5)

    def differing_connections(self, engine: Engine) -> list[str]:
        tables = {
            "simulated": ("projects", "issues"),
            "simulated_crm": ("contacts", "deals"),
            "simulated_docs": ("files",),
        }
        differ = []
        for connection in engine.connections():
            if connection.status != "active":
                continue
            tenant = self.simulation.tenant(connection.config["tenant"])
            for table in tables[connection.provider]:
                expected = {str(row["id"]): row for row in tenant.rows(table)}
                stored = {
                    r.external_id: r.data
                    for r in engine.records(connection.id, table, limit=100_000)
                }
                if stored != expected:
                    differ.append(f"{connection.name}.{table}")
        return differ

    def leftovers_of_deleted(self, engine: Engine) -> int:
        with engine.pool.connection() as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM records WHERE connection_id = ANY(%(ids)s)) "
                "     + (SELECT count(*) FROM table_state WHERE connection_id = ANY(%(ids)s)) "
                "     + (SELECT count(*) FROM connections WHERE id = ANY(%(ids)s)) AS n",
                {"ids": self.deleted},
            ).fetchone()
        return int(row["n"]) if row else -1

    def logged(self, line: str) -> int:
        """How often the workers' logs say ``line``: a table an attempt took up where an
        earlier one left it, a table read again because its seen keys were lost."""
        return sum(log.count(line) for log in self.logs())

    def logs(self) -> list[str]:
        return [log.read_text(errors="replace") for log in self.root.glob("worker-*.log")]

    def ingestion_reckoning(self, engine: Engine) -> tuple[dict[str, int], dict[str, int]]:
        """The ingestions' figures and checks that the database alone cannot give."""
        embeds = ingestions.read_embeds(line for log in self.logs() for line in log.splitlines())
        allowed, past = ingestions.embedded_again(embeds, self.crashes)
        with engine.pool.connection() as conn:
            audit = conn.execute("SELECT key, blocked_until, at FROM chaos_budget_audit").fetchall()
        windows = ingestions.windows_of(self.simulation, self.url, audit, self.resumes)
        for said in windows.samples[:20]:
            console.print(f"request inside a recorded window: {said}")
        lost = ingestions.files_lost(engine, self.simulation)
        if lost:
            console.print(f"files lost: {', '.join(lost[:20])}")
        figures = {
            "batches embedded (workers' logs)": embeds.embedded,
            "embedding requests served": self.embeddings.requests,
            "ingestions resumed mid-way by a later attempt": self.logged("resumes at chunk"),
            "attempts ended because a crash lost their last batches": self.logged(
                "the database lost the last batches"
            ),
            "batches embedded again after an attempt ended early (allowed)": allowed,
            "windows announced by the provider's 429s": windows.announced,
            "of them recorded in a shared budget by a worker": windows.recorded,
            "requests inside one that a frozen worker sent as it was resumed": windows.excused,
        }
        checks = {
            "live files neither indexed as the provider has them nor failed": len(lost),
            "batches embedded more than once past the one allowed": past,
            "requests inside a window a worker had recorded": windows.inside,
        }
        return figures, checks

    def report(self, engine: Engine, out: Console) -> dict[str, object]:
        """Print the faults and the reckoning; return them (``ok``: every zero is zero)."""
        with engine.pool.connection() as conn:
            figures = {
                name: conn.execute(sql).fetchone()
                for name, sql in {**FIGURES, **JOB_FIGURES}.items()
            }
            lease = {"lease": timedelta(seconds=self.plan.lease)}
            checks = {
                name: conn.execute(sql, lease if "%(lease)s" in sql else None).fetchone()
                for name, sql in CHECKS.items()
            }
            jobs = {"sent": sorted(self.sent), "expire": timedelta(seconds=chaos_app.EXPIRE)}
            checks.update(
                {name: conn.execute(sql, jobs).fetchone() for name, sql in JOB_CHECKS.items()}
            )
            figures.update(
                {name: conn.execute(sql).fetchone() for name, sql in ingestions.FIGURES.items()}
            )
            checks.update(
                {name: conn.execute(sql).fetchone() for name, sql in ingestions.CHECKS.items()}
            )
        values = {n: int(next(iter(r.values()))) for n, r in checks.items() if r}
        more_figures, more_checks = self.ingestion_reckoning(engine)
        values.update(more_checks)
        differ = self.differing_connections(engine)
        values["connections whose records differ from the provider"] = len(differ)
        values["deleted connections with data left"] = self.leftovers_of_deleted(engine)
        faults = Table(title="faults fired")
        faults.add_column("fault")
        faults.add_column("times", justify="right")
        for kind in FAULTS:
            faults.add_row(kind, str(self.fired[kind]))
        summary = Table(title="chaos summary")
        summary.add_column("measure")
        summary.add_column("value", justify="right")
        summary.add_column("must be")
        for name, row in figures.items():
            summary.add_row(name, str(next(iter(row.values())) if row else "?"), "")
        summary.add_row("workers that exited and were started again", str(self.respawned), "")
        resumed = self.logged("where an earlier attempt left it") - self.logged("resumes at chunk")
        summary.add_row("tables resumed mid-way by a later attempt", str(resumed), "")
        for name, value in more_figures.items():
            summary.add_row(name, str(value), "")
        lost = self.logged("unlogged run_seen_keys): reading the table again")
        summary.add_row("tables read again after a crash emptied their seen keys", str(lost), "")
        ok = True
        for name, value in values.items():
            good = value == 0
            ok &= good
            summary.add_row(name, f"[{'green' if good else 'red'}]{value}", "0")
        out.print(faults)
        out.print(summary)
        if differ:
            out.print(f"differing: {', '.join(differ[:20])}")
        with engine.pool.connection() as conn:
            failed = conn.execute(
                "SELECT id, kind, status, attempts, error FROM connection_runs "
                "WHERE status IN ('partial', 'failed') ORDER BY id LIMIT 20"
            ).fetchall()
        for run in failed:  # legitimate outcomes under chaos, but say why
            error = run["error"] or {}
            out.print(
                f"run {run['id']} ({run['kind']}) {run['status']} after {run['attempts']} "
                f"attempt(s): {error.get('kind')}: {error.get('message')}"
            )
        missing = [k for k in FAULTS if self.fired[k] < self.plan.min_each]
        if missing:
            out.print(f"[red]faults that fired fewer than {self.plan.min_each} times: {missing}")
            ok = False
        return {
            "ok": ok,
            "faults_fired": {kind: self.fired[kind] for kind in FAULTS},
            "faults_fired_too_rarely": missing,
            "figures": {
                **{
                    name: next(iter(row.values())) if row else None for name, row in figures.items()
                },
                **more_figures,
            },
            "workers_started_again": self.respawned,
            "must_be_zero": values,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="ten minutes of faults")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    add_json_option(parser)
    args = parser.parse_args()
    # The tables go to stdout, or to stderr when stdout carries the JSON document.
    out = Console(file=sys.stderr if args.json else sys.stdout)
    plan = LONG if args.long else SHORT
    root = Path(tempfile.mkdtemp(prefix="connector-sync-chaos-"))
    chaos = Chaos(plan, args.seed, root)
    console.print(f"chaos: seed {args.seed}, {plan}, work dir {root}")
    engine: Engine | None = None
    fleet: Fleet | None = None
    outcome: dict[str, object] = {"ok": False}
    started = time.monotonic()
    try:
        engine = chaos.setup()
        env = {
            **os.environ,
            "CONNECTOR_SYNC_SECRET_KEYS": chaos.key,
            "CONNECTOR_SYNC_LANES": chaos_app.LANES,
            **ingestions.environment(),
        }
        for name, value in chaos.settings().model_dump(exclude_unset=True).items():
            if name in ("database_url", "secret_keys", "home", "schema_name") or value is None:
                continue
            env[f"CONNECTOR_SYNC_{name.upper()}"] = (
                "[" + ",".join(map(str, value)) + "]" if isinstance(value, tuple) else str(value)
            )
        fleet = Fleet(chaos.postgres, root, env)
        fleet.start(plan.workers)
        fleet.wait_registered(engine, 60)
        console.print(f"{plan.workers} workers started; injecting faults for {plan.duration:.0f} s")
        chaos.inject(engine, fleet)
        console.print("faults off; last clean sync")
        chaos.settle(engine, fleet)
        outcome = chaos.report(engine, out)
    finally:
        ok = bool(outcome["ok"])
        if fleet is not None:
            fleet.stop_all()
        if engine is not None:
            engine.close()
        chaos.stop_server()
        chaos.embeddings.stop()
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            chaos.postgres.stop()
        if not args.keep and ok:
            shutil.rmtree(root, ignore_errors=True)
        console.print(
            f"chaos took {time.monotonic() - started:.0f} s; "
            f"{'all zeros' if ok else 'FAILED, logs in ' + str(root)}"
        )
    print_json(
        "chaos",
        args,
        outcome,
        machine=machine_info(None),
        plan=plan,
        seconds=round(time.monotonic() - started, 1),
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
