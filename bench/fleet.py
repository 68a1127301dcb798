"""Throughput and latency as workers are added: 1, 2, 4, 8, 16 and 32 worker processes against
one Postgres, with many workspaces and with few workspaces where claimers collide.

    python -m bench.fleet [--quick] [--workers 1,2,4,8,16,32] [--job-ms 20] [--load 0.5]
                          [--shared-server] [--json]

Each worker is a real ``Worker.run()`` process as deployed (LISTEN/NOTIFY, 2 s poll, pool of 4).
Each run's connector waits ``--job-ms`` on its "provider" (default 20 ms) and writes nothing, so
the run costs the queue's work plus a wait, as a sync waiting on the network does. Two mixes:

- many workspaces: every run in a workspace of its own; claimers never meet on a workspace row;
- few workspaces: 4 workspaces x 8 providers, runs interleaved across the 32 lanes, so up to 32
  runs may run at once, but every claim locks one of only 4 workspace rows (``FOR NO KEY UPDATE
  ... SKIP LOCKED``): a claimer that finds all four taken claims nothing and waits to be woken.

For each number of workers and each mix, two phases:

1. drain: a backlog of runs is inserted in one transaction that also notifies; drain rate is
   runs / (last finish - first start), both stamped by the server in ``run_attempts``;
2. load: runs are enqueued one at a time (the engine's ``enqueue_run``) by 4 producer threads at
   ``--load`` x the drain rate just measured, with exponential gaps (a Poisson arrival);
   enqueue-to-start is ``run_attempts.started_at - connection_runs.queued_at`` (the claim's
   clock minus the enqueue's transaction start, before its commit; one clock).

While each phase runs, a sampler reads ``pg_stat_activity`` (what active backends wait on) and
``pg_locks`` (which locks are waited for) every 10 ms. The workers' statements per run, and the
claims that found nothing, come from ``pg_stat_statements``; CPU per run of the workers and of
every Postgres process from ``/proc``.

The reference beside ours: the bare claim-then-finish SQL loop (one ``UPDATE ... (SELECT ...
FOR UPDATE SKIP LOCKED) RETURNING`` and one finish ``UPDATE``, with the same wait between them)
from as many processes, on a minimal table, measured the same way.

By default it starts a private Postgres (same binaries and defaults as the system's, with
``max_connections = 400`` and ``pg_stat_statements`` preloaded) on a free local port, because 32
workers hold up to 160 connections, more than a shared server's default 100 should give one
benchmark; ``--shared-server`` uses ``DATABASE_URL`` instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.claim import BARE_FORMS, BARE_TABLE, _normal, _query_names
from bench.common import (
    Column,
    PrivatePostgres,
    add_json_option,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    migrate,
    percentile,
    print_json,
    print_table,
    python,
    ratio,
    scratch_database,
    spawn,
)

TERMINAL = ("succeeded", "partial", "failed", "cancelled")
# Named statements the benchmark sends itself (the producers' enqueues), not the workers.
BENCH_STATEMENTS = frozenset({"enqueue_run"})
PRODUCERS = 4
SAMPLE_EVERY = 0.01  # seconds between two samples of pg_stat_activity and pg_locks
BARE_CLAIM, BARE_FINISH = BARE_FORMS[
    "claim UPDATE ... (SELECT ... SKIP LOCKED) RETURNING, then finish UPDATE"
]


@dataclass(frozen=True)
class Mix:
    name: str
    workspaces: int | None  # None: a workspace per run
    providers: int

    @property
    def tag(self) -> str:
        """The prefix of its workspaces' and connections' names."""
        return "many" if self.workspaces is None else f"few{self.workspaces}"


MIXES = (Mix("many workspaces", None, 1), Mix("4 workspaces x 8 providers", 4, 8))


@dataclass
class Phase:
    """What one phase (a drain or a load) measured."""

    runs: int = 0
    seconds: float = 0.0
    rate: float = float("nan")  # runs/s
    latencies_ms: list[float] = field(default_factory=list)
    worker_cpu_s: float = 0.0
    postgres_cpu_s: float | None = None
    waits: Counter[str] = field(default_factory=Counter)  # active-backend samples by wait event
    locks: Counter[str] = field(default_factory=Counter)  # ungranted locks, summed over samples
    lock_waiters: Counter[str] = field(default_factory=Counter)  # "event in statement"
    samples: int = 0
    # The workers' statements by name (pg_stat_statements): calls, rows, total_ms.
    statements: dict[str, dict[str, float]] = field(default_factory=dict)

    def per_run(self, value: float | None) -> float | None:
        return None if value is None or not self.runs else value / self.runs

    @property
    def calls(self) -> float | None:
        """Statements the workers sent (one round trip each)."""
        if not self.statements:
            return None
        return sum(v["calls"] for k, v in self.statements.items() if k not in BENCH_STATEMENTS)

    @property
    def empty_claims(self) -> float | None:
        """Claims (outside the loop's finish-and-claim) that found nothing to run: a worker
        woken, or polling, for no run it could take."""
        if not self.statements:
            return None
        claims = [self.statements.get(name) for name in ("claim_run", "claim_run_v3")]
        return sum(c["calls"] - c["rows"] for c in claims if c is not None)


@dataclass
class Point:
    system: str
    mix: str
    workers: int
    drain: Phase = field(default_factory=Phase)
    load: Phase = field(default_factory=Phase)
    error: str = ""


# -- the database side --------------------------------------------------------------------


def setup_mix(url: str, mix: Mix, connections: int, job_ms: float) -> None:
    """Workspaces and connections for one mix, named after it."""
    from bench.connectors import WAIT_PROVIDERS

    providers = list(WAIT_PROVIDERS[: mix.providers])
    tag = mix.tag
    with connect(url) as conn:
        workspaces = mix.workspaces or connections
        conn.execute(
            "INSERT INTO workspaces (name) SELECT %(tag)s || '-' || g "
            "FROM generate_series(1, %(n)s) g",
            {"tag": tag, "n": workspaces},
        )
        # Connection g goes to workspace g % W and provider (g / W) % P: consecutive ids walk
        # every lane before coming back to the first.
        conn.execute(
            "INSERT INTO connections (workspace_id, name, provider, config) "
            "SELECT w.id, %(tag)s || '-c' || g, (%(providers)s::text[])[1 + (g / %(w)s) %% %(p)s], "
            "       jsonb_build_object('ms', %(ms)s::float8) "
            "  FROM generate_series(0, %(n)s - 1) g "
            "  JOIN workspaces w ON w.name = %(tag)s || '-' || (1 + g %% %(w)s) "
            " ORDER BY g",
            {
                "tag": tag,
                "providers": providers,
                "w": workspaces,
                "p": len(providers),
                "n": connections,
                "ms": job_ms,
            },
        )


def connection_ids(url: str, mix: Mix) -> list[int]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT id FROM connections WHERE name LIKE %s ORDER BY id", (f"{mix.tag}-c%",)
        ).fetchall()
    return [int(r[0]) for r in rows]


# What enqueue_run() inserts, for many connections at once, and the wake-up it sends.
BACKLOG = """
WITH queued AS (
    INSERT INTO connection_runs (connection_id, workspace_id, provider, kind, status, trigger)
    SELECT id, workspace_id, provider, 'sync', 'queued', 'bench'
      FROM connections WHERE id = ANY(%(ids)s) ORDER BY id
    RETURNING id
)
SELECT min(id), max(id), count(*), pg_notify(notify_channel(), 'enqueued') FROM queued
"""


def reset_statements(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except psycopg.Error:
        return False  # not preloaded on this server


def read_statements(conn: psycopg.Connection[Any]) -> dict[str, dict[str, float]]:
    """The engine's named statements that ran in this database since the reset: calls, rows
    and total execution time, by name (the benchmark's own queries left out)."""
    names = _query_names()
    rows = conn.execute(
        "SELECT query, calls, rows, total_exec_time FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    found: dict[str, dict[str, float]] = {}
    for query, calls, nrows, total in rows:
        name = names.get(_normal(query))
        if name is None:
            continue
        seen = found.setdefault(name, {"calls": 0, "rows": 0, "total_ms": 0.0})
        seen["calls"] += calls
        seen["rows"] += nrows
        seen["total_ms"] += total
    return dict(sorted(found.items(), key=lambda item: -item[1]["total_ms"]))


class Sampler(threading.Thread):
    """Every 10 ms: the wait event of each active backend of this database (CPU when it waits on
    nothing) and the number of locks not granted."""

    QUERY = """
        SELECT coalesce((SELECT jsonb_object_agg(what, n) FROM (
                   -- NOTIFY's commit-order lock: "database 0" in pg_database, held by every
                   -- notifying transaction until its commit is flushed.
                   SELECT CASE WHEN locktype = 'object' AND classid = 'pg_database'::regclass
                                    AND database = 0 AND objid = 0 THEN 'NOTIFY commit lock'
                               ELSE locktype || ' ' || mode END AS what, count(*) AS n
                     FROM pg_locks WHERE NOT granted GROUP BY 1) l), '{}'),
               coalesce((SELECT jsonb_object_agg(what, n) FROM (
                   SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS what,
                          count(*) AS n
                     FROM pg_stat_activity
                    WHERE datname = current_database() AND state = 'active'
                      AND pid <> pg_backend_pid()
                    GROUP BY 1) w), '{}'),
               -- Who waits for a heavyweight lock: the statement, to be named below.
               ARRAY(SELECT wait_event || ' ' || query FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock')
    """

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(url)
        self.waits: Counter[str] = Counter()
        self.locks: Counter[str] = Counter()
        self.waiters: Counter[str] = Counter()  # which statement waits for which lock
        self.names = _query_names()
        self.samples = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(SAMPLE_EVERY):
            row = self.conn.execute(self.QUERY).fetchone()
            assert row is not None
            self.samples += 1
            self.locks.update(row[0])
            self.waits.update(row[1])
            for waiter in row[2]:
                event, _, query = waiter.partition(" ")
                name = self.names.get(_normal(query), " ".join(query.split())[:40])
                self.waiters[f"{event} in {name}"] += 1

    def stop(self, phase: Phase) -> None:
        self._stopping.set()
        self.join()
        self.conn.close()
        phase.waits, phase.locks, phase.samples = self.waits, self.locks, self.samples
        phase.lock_waiters = self.waiters


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    pids.append(int(entry.name))
    return pids


class Cpu:
    """CPU seconds spent by the workers and, on a private server, by every Postgres process."""

    def __init__(self, workers: list[int], postmaster: int | None) -> None:
        self.workers = workers
        self.postmaster = postmaster
        self.start = self._read()

    def _read(self) -> tuple[float, dict[int, float]]:
        worker = sum(_cpu_seconds(p) for p in self.workers)
        server: dict[int, float] = {}
        if self.postmaster is not None:
            for pid in [self.postmaster, *_children(self.postmaster)]:
                server[pid] = _cpu_seconds(pid)
        return worker, server

    def begin(self) -> None:
        self.start = self._read()

    def end(self, phase: Phase) -> None:
        worker, server = self._read()
        phase.worker_cpu_s = worker - self.start[0]
        if self.postmaster is not None:
            # A backend that started during the phase counts from zero.
            phase.postgres_cpu_s = sum(v - self.start[1].get(p, 0.0) for p, v in server.items())


@contextlib.contextmanager
def observed(url: str, phase: Phase, cpu: Cpu) -> Iterator[None]:
    """Samples waits and locks, and counts CPU and statements, while the block runs."""
    with connect(url) as conn:
        statements = reset_statements(conn)
    sampler = Sampler(url)
    sampler.start()
    cpu.begin()
    try:
        yield
    finally:
        cpu.end(phase)
        sampler.stop(phase)
        if statements:
            with connect(url) as conn:
                phase.statements = read_statements(conn)


def wait_until_done(url: str, first: int, last: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with connect(url) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM connection_runs WHERE id BETWEEN %s AND %s "
                "AND status <> ALL(%s)",
                (first, last, list(TERMINAL)),
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.05)
    raise RuntimeError(f"runs {first}-{last} did not all finish within {timeout:.0f} s")


def drain(url: str, ids: list[int], phase: Phase, cpu: Cpu) -> None:
    with observed(url, phase, cpu):
        with connect(url) as conn:
            row = conn.execute(BACKLOG, {"ids": ids}).fetchone()
        assert row is not None
        first, last, count = int(row[0]), int(row[1]), int(row[2])
        wait_until_done(url, first, last, timeout=60 + len(ids) / 5)
    with connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(a.finished_at) - min(a.started_at)), count(*), "
            "count(*) FILTER (WHERE r.status <> 'succeeded') "
            "FROM run_attempts a JOIN connection_runs r ON r.id = a.run_id "
            "WHERE a.run_id BETWEEN %s AND %s",
            (first, last),
        ).fetchone()
    assert row is not None
    if row[1] != count or row[2]:
        raise RuntimeError(f"{row[1]} attempts for {count} runs, {row[2]} not succeeded")
    phase.runs, phase.seconds = count, float(row[0])
    phase.rate = count / phase.seconds


def load(url: str, ids: list[int], rate: float, phase: Phase, cpu: Cpu) -> None:
    """Enqueue one run per id at ``rate`` runs/s in all, from PRODUCERS threads."""
    from sync.store.queries import QUERIES

    todo: queue.Queue[int] = queue.Queue()
    for connection_id in ids:
        todo.put(connection_id)
    made: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        with connect(url) as conn:
            due = time.monotonic()
            while True:
                try:
                    connection_id = todo.get_nowait()
                except queue.Empty:
                    return
                due += rng.expovariate(rate / PRODUCERS)
                time.sleep(max(0.0, due - time.monotonic()))
                row = conn.execute(
                    QUERIES.enqueue_run,
                    {
                        "connection_id": connection_id,
                        "workspace_id": None,
                        "trigger": "bench",
                        "max_attempts": 3,
                    },
                ).fetchone()
                with lock:
                    if row is None or row[0] in made:
                        errors.append(f"connection {connection_id} had no new run")
                    else:
                        made.append(int(row[0]))

    with observed(url, phase, cpu):
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError(errors[0])
        wait_until_done(url, min(made), max(made), timeout=60 + len(ids) / 5)
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT 1000 * extract(epoch FROM a.started_at - r.queued_at), r.status "
            "FROM connection_runs r JOIN run_attempts a ON a.run_id = r.id AND a.attempt = 1 "
            "WHERE r.id = ANY(%s)",
            (made,),
        ).fetchall()
    if len(rows) != len(made) or any(status != "succeeded" for _, status in rows):
        raise RuntimeError(f"{len(rows)} of {len(made)} runs started, not all succeeded")
    phase.runs = len(made)
    phase.latencies_ms = [float(r[0]) for r in rows]


# -- processes ----------------------------------------------------------------------------


class Fleet:
    """N ``bench.worker --mode serve`` processes (``Worker.run()`` with LISTEN/NOTIFY)."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.procs = [
            spawn([python(), "-m", "bench.worker", "--url", url, "--mode", "serve"])
            for _ in range(count)
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_ready(self, timeout: float = 120) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a worker did not start: {line!r}")
        # Ready means idle in its loop with its LISTEN connection open: a wake-up sent before
        # that would be missed until the next poll.
        deadline = time.monotonic() + timeout
        with connect(self.url) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM workers WHERE stopped_at IS NULL), "
                    "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "   AND application_name LIKE '%%/listen' AND state = 'idle')"
                ).fetchone()
                if row is not None and row[0] >= len(self.procs) and row[1] >= len(self.procs):
                    return
                time.sleep(0.1)
        raise RuntimeError("the workers did not all register and LISTEN")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bare_child(url: str, job_ms: float) -> None:
    """One client of the bare loop: claim, wait, finish, until nothing is left."""
    with psycopg.connect(url, autocommit=True) as conn:
        print("READY", flush=True)
        sys.stdin.readline()
        cpu = time.process_time()
        count, first, last = 0, 0.0, 0.0
        while True:
            row = conn.execute(BARE_CLAIM).fetchone()
            if row is None:
                break
            if not count:
                first = time.time()
            if job_ms > 0:
                time.sleep(job_ms / 1000)
            conn.execute(BARE_FINISH, (row[0],))
            count, last = count + 1, time.time()
        cpu = time.process_time() - cpu
        print(json.dumps({"count": count, "first": first, "last": last, "cpu_s": cpu}), flush=True)
        # Keep the session (its backend's CPU is read) until the parent has measured.
        sys.stdin.readline()


def bare(
    url: str, workers: int, runs: int, job_ms: float, point: Point, postmaster: int | None
) -> None:
    with connect(url) as conn:
        conn.execute("TRUNCATE public.bare_jobs")
        conn.execute(
            "INSERT INTO public.bare_jobs (status) SELECT 'queued' FROM generate_series(1, %s)",
            (runs,),
        )
        conn.execute("VACUUM ANALYZE public.bare_jobs")
    procs = [
        spawn(
            [
                python(),
                "-m",
                "bench.fleet",
                "--child",
                "bare",
                "--url",
                url,
                "--job-ms",
                str(job_ms),
            ],
            stdin=subprocess.PIPE,
        )
        for _ in range(workers)
    ]
    outs = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("a bare client did not start")
        # The clients report their own CPU; their backends' is read while they are connected.
        with observed(url, point.drain, Cpu([], postmaster)):
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            for proc in procs:
                assert proc.stdout is not None
                outs.append(json.loads(proc.stdout.readline()))
        for proc in procs:
            proc.communicate("done\n", timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = [o for o in outs if o["count"]]
    count = sum(o["count"] for o in outs)
    if count != runs:
        raise RuntimeError(f"the bare loop finished {count} of {runs}")
    point.drain.runs = count
    point.drain.worker_cpu_s = sum(o["cpu_s"] for o in outs)
    point.drain.seconds = max(o["last"] for o in done) - min(o["first"] for o in done)
    point.drain.rate = count / point.drain.seconds


# -- main ---------------------------------------------------------------------------------


def backlog_size(workers: int, quick: bool) -> int:
    return max(100, 40 * workers) if quick else max(300, 120 * workers)


@contextlib.contextmanager
def server(shared: bool) -> Iterator[tuple[str, int | None]]:
    """The server URL to create the scratch database on, and the postmaster's pid if private."""
    if shared:
        yield os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"), None
        return
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    postgres = PrivatePostgres(
        root,
        {"max_connections": "400", "shared_preload_libraries": "'pg_stat_statements'"},
    )
    try:
        postgres.init()
        postgres.start()
        pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
        yield postgres.url, pid
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller backlogs and loads")
    parser.add_argument("--workers", default="1,2,4,8,16,32", help="worker counts (1,2,...,32)")
    parser.add_argument("--job-ms", type=float, default=20.0, help="each run's wait (20 ms)")
    parser.add_argument("--load", type=float, default=0.5, help="load phase, x drain rate (0.5)")
    parser.add_argument("--samples", type=int, help="runs in each load phase (400; quick 150)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare SQL loop")
    parser.add_argument(
        "--shared-server", action="store_true", help="use DATABASE_URL, not a private Postgres"
    )
    add_json_option(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "bare":
        bare_child(args.url, args.job_ms)
        return
    json_mode(args)
    counts = [int(n) for n in args.workers.split(",")]
    samples = args.samples or (150 if args.quick else 400)
    per_mix = max(max(backlog_size(n, args.quick) for n in counts), samples)
    points: list[Point] = []

    with server(args.shared_server) as (base, postmaster):
        os.environ["DATABASE_URL"] = base  # scratch_database() creates its database there
        with scratch_database("fleet") as url:
            machine = machine_info(url)
            console.print(
                f"[bold]bench.fleet[/bold]: {', '.join(map(str, counts))} workers, "
                f"runs waiting {args.job_ms:g} ms, load {args.load:g} x drain"
            )
            console.print(machine_line(machine))
            migrate(url)
            with connect(url) as conn:
                conn.execute(BARE_TABLE)
                if postmaster is not None:  # preloaded on the private server
                    conn.execute("CREATE EXTENSION pg_stat_statements")
            for mix in MIXES:
                setup_mix(url, mix, per_mix, args.job_ms)
            with connect(url) as conn:
                conn.execute("VACUUM ANALYZE")
            ids = {mix.name: connection_ids(url, mix) for mix in MIXES}
            for n in counts:
                measure_fleet(url, n, args, ids, postmaster, samples, points)
                if not args.no_bare:
                    point = Point("bare SQL loop", "-", n)
                    try:
                        bare(url, n, backlog_size(n, args.quick), args.job_ms, point, postmaster)
                    except Exception as exc:
                        point.error = str(exc).splitlines()[0][:120]
                    points.append(point)
                    console.print(
                        f"  bare SQL loop  {n:>2} clients: {point.drain.rate:8,.0f} runs/s"
                    )

    report(points, args)
    print_json(
        "fleet",
        args,
        [_json(p) for p in points],
        machine=machine,
        bends={_what(mix): bend(points, mix) for mix in [m.name for m in MIXES] + ["-"]},
        cpu_ceilings={m.name: cpu_ceiling(points, m.name) for m in MIXES},
    )


def measure_fleet(
    url: str,
    n: int,
    args: argparse.Namespace,
    ids: dict[str, list[int]],
    postmaster: int | None,
    samples: int,
    points: list[Point],
) -> None:
    fleet = Fleet(url, n)
    try:
        fleet.wait_ready()
        cpu = Cpu(fleet.pids, postmaster)
        for mix in MIXES:
            point = Point("connector-sync", mix.name, n)
            points.append(point)
            try:
                drain(url, ids[mix.name][: backlog_size(n, args.quick)], point.drain, cpu)
                # About ten seconds of arrivals: at least 50 runs, at most `samples`.
                count = max(50, min(samples, int(point.drain.rate * args.load * 10)))
                load(url, ids[mix.name][:count], point.drain.rate * args.load, point.load, cpu)
            except Exception as exc:
                point.error = (str(exc) or type(exc).__name__).splitlines()[0][:120]
                console.print(f"[red]{mix.name}, {n} workers: {point.error}[/red]")
                continue
            console.print(
                f"  {mix.name:30} {n:>2} workers: {point.drain.rate:8,.0f} runs/s, "
                f"p95 {percentile(point.load.latencies_ms, 95):7.1f} ms at "
                f"{args.load:g} x, {_per_run(point.drain.calls, point.drain):.1f} "
                "statements/run"
            )
    finally:
        fleet.stop()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _per_run(value: float | None, phase: Phase) -> float:
    per = phase.per_run(value)
    return float("nan") if per is None else per


def _top(locks: Counter[str], samples: int, k: int = 2) -> str:
    """The locks most waited for, as the mean number of waiters per sample."""
    if not samples:
        return ""
    return ", ".join(f"{what} {n / samples:.2f}" for what, n in locks.most_common(k)) or "none"


def _top_waits(phase: Phase, k: int = 3) -> str:
    total = sum(phase.waits.values())
    if not total:
        return ""
    return ", ".join(f"{w} {100 * c / total:.0f}%" for w, c in phase.waits.most_common(k))


def bend(points: list[Point], mix: str) -> int | None:
    """The first worker count at which doubling the workers gave less than 1.5x the drain rate
    (the curve's knee), or None if it never did."""
    rates = {p.workers: p.drain.rate for p in points if p.mix == mix and not p.error}
    for n in sorted(rates):
        if n // 2 in rates and rates[n] < 1.5 * rates[n // 2]:
            return n
    return None


def report(points: list[Point], args: argparse.Namespace) -> None:
    rows, causes = [], []
    for p in points:
        one = next(
            (q.drain.rate for q in points if (q.mix, q.system, q.workers) == (p.mix, p.system, 1)),
            float("nan"),
        )
        if p.error:
            rows.append([p.system, p.mix, p.workers, "error", p.error, "", "", ""])
            continue
        lat = p.load.latencies_ms
        rows.append(
            [
                p.system,
                p.mix,
                p.workers,
                f"{p.drain.rate:,.0f}",
                ratio(p.drain.rate, one),
                f"{p.drain.rate / p.workers * args.job_ms / 1000:.2f}" if args.job_ms else "",
                f"{percentile(lat, 50):.1f}" if lat else "",
                f"{percentile(lat, 95):.1f}" if lat else "",
            ]
        )
        causes.append(
            [
                p.system if p.mix == "-" else p.mix,
                p.workers,
                _fmt(p.drain.per_run(p.drain.calls), ".1f"),
                _fmt(p.drain.per_run(p.drain.empty_claims), ".2f"),
                _fmt(p.load.per_run(p.load.empty_claims), ".2f"),
                _fmt(_ms(p.drain.per_run(p.drain.worker_cpu_s or None)), ".2f"),
                _fmt(_ms(p.drain.per_run(p.drain.postgres_cpu_s)), ".2f"),
                _top(p.drain.locks, p.drain.samples),
                _top_waits(p.drain),
            ]
        )
    print_table(
        f"Workers against one Postgres: runs that wait {args.job_ms:g} ms; drain rate of a "
        f"backlog, enqueue-to-start at {args.load:g} x that rate",
        [
            Column("system", "left"),
            Column("mix", "left"),
            "workers",
            "runs/s",
            "x 1 worker",
            "busy share",
            "p50 ms",
            "p95 ms",
        ],
        rows,
    )
    print_table(
        "Where the time goes (drain, per run executed; empty claims also under load)",
        [
            Column("mix", "left"),
            "workers",
            "statements",
            "empty claims",
            "empty claims (load)",
            "worker CPU ms (bare: client)",
            "Postgres CPU ms",
            Column("waiting for a lock (mean waiters)", "left"),
            Column("active backends wait on", "left"),
        ],
        causes,
    )
    for mix in [m.name for m in MIXES] + ["-"]:
        knee = bend(points, mix)
        line = f"{_what(mix)}: " + (
            f"doubling to {knee} workers gave < 1.5x" if knee else "no bend up to the largest count"
        )
        if ceiling := cpu_ceiling(points, mix):
            line += (
                f"; CPU per run with {ceiling['workers']:.0f} workers "
                f"{ceiling['cpu_ms_per_run']:.2f} ms (workers and Postgres): at most "
                f"{ceiling['runs_per_s_per_core']:,.0f} runs/s per core"
            )
        console.print(line)


def _what(mix: str) -> str:
    return "bare SQL loop" if mix == "-" else mix


def cpu_ceiling(points: list[Point], mix: str) -> dict[str, float] | None:
    """What the CPU a run costs allows per core (a model for more cores: the drain cannot go
    faster than cores x this), from the drain with the most workers."""
    measured = [p for p in points if p.mix == mix and not p.error and p.drain.postgres_cpu_s]
    if not measured:
        return None
    p = max(measured, key=lambda q: q.workers)
    cpu_ms = 1000 * (p.drain.worker_cpu_s + (p.drain.postgres_cpu_s or 0)) / p.drain.runs
    return {"workers": p.workers, "cpu_ms_per_run": cpu_ms, "runs_per_s_per_core": 1000 / cpu_ms}


def _json(p: Point) -> dict[str, Any]:
    def phase(ph: Phase) -> dict[str, Any]:
        return {
            "runs": ph.runs,
            "seconds": ph.seconds,
            "runs_per_s": ph.rate,
            "latency_ms": {f"p{q}": percentile(ph.latencies_ms, q) for q in (50, 95, 99)}
            if ph.latencies_ms
            else None,
            "statements_per_run": ph.per_run(ph.calls),
            "empty_claims_per_run": ph.per_run(ph.empty_claims),
            "worker_cpu_ms_per_run": _ms(ph.per_run(ph.worker_cpu_s or None)),
            "postgres_cpu_ms_per_run": _ms(ph.per_run(ph.postgres_cpu_s)),
            "wait_samples": dict(ph.waits.most_common()),
            "samples": ph.samples,
            "ungranted_lock_samples": dict(ph.locks.most_common()),
            "lock_waiter_samples": dict(ph.lock_waiters.most_common()),
            "statements": ph.statements,
        }

    return {
        "system": p.system,
        "mix": p.mix,
        "workers": p.workers,
        "drain": phase(p.drain),
        "load": phase(p.load),
        "error": p.error or None,
    }


if __name__ == "__main__":
    main()
