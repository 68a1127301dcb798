"""Enqueue-to-start latency with an idle worker: from the moment the enqueuing client sent its
enqueue to the moment the worker started the job, p50/p95/p99.

    python -m bench.latency [--quick] [--samples N] [--no-peers] [--json]

- bare LISTEN/NOTIFY: a process LISTENs; the bench sends ``NOTIFY`` (autocommit); the wake-up
  ceiling no notified queue can beat. Also the same with a row inserted in the NOTIFY's
  statement, so its commit flushes WAL as every durable enqueue's does.
- ours: a real worker process (``Worker.run()``); the bench calls ``Engine.sync()``. Two
  start marks: the claim (``run_attempts.started_at``, stamped inside ``claim_run()``) and the
  connector's constructor (the first connector code to run). With LISTEN/NOTIFY (poll
  interval 2 s, the default), then polling only at 2 s and at 0.1 s.
- ours, application jobs: ``engine.queues.send`` to a queue served by one lane of a worker
  process (``Worker.run()``, LISTEN/NOTIFY); the start mark is the handler's first line.
- peers, each worker in its own process: Procrastinate, PgQueuer and graphile-worker (all
  LISTEN/NOTIFY), pg-boss 10 (polling only, at its 0.5 s minimum).

Each sample: wait a random 50-250 ms with the worker idle (its previous job done), read the
wall clock, enqueue, read it again when the enqueue returned, then the worker's start mark
(same machine, same clock). Latency is measured from the first mark: Postgres delivers a
notification as the enqueue's transaction commits, before the commit's reply is back at the
client, so a mark taken after the enqueue returned can come after the worker already woke. The
table shows that measure too, beside the enqueue's own duration.
"""

from __future__ import annotations

import argparse
import queue
import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

import bench.connectors  # noqa: F401 - registers the bench connectors
from bench.common import (
    NODE_DIR,
    Column,
    add_json_option,
    as_uri,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    percentile,
    print_json,
    print_table,
    python,
    ratio,
    scratch_database,
    settings_for,
    spawn,
)


@dataclass
class Series:
    system: str
    config: str
    samples: list[float] = field(default_factory=list)  # ms from before the enqueue was sent
    from_return: list[float] = field(default_factory=list)  # ms from the enqueue's return
    error: str = ""
    ours: bool = False
    ceiling: bool = False

    @property
    def enqueue_ms(self) -> list[float]:
        """How long each enqueue took to return (its round trip, commit included)."""
        return [a - b for a, b in zip(self.samples, self.from_return, strict=True)]

    def add(self, sent: float, returned: float, started: float) -> None:
        self.samples.append(1000 * (started - sent))
        self.from_return.append(1000 * (started - returned))


class Marks:
    """Reads ``START <time>`` lines from a worker process in the background."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[float] = queue.Queue()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self.ready.set()
            elif line.startswith("START "):
                self.lines.put(float(line.split()[1]))

    def next(self, timeout: float) -> float:
        return self.lines.get(timeout=timeout)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def sample(
    series: Series,
    proc: subprocess.Popen[str],
    count: int,
    enqueue: Callable[[], Any],
    *,
    after: Callable[[Any], None] | None = None,
    timeout: float = 10.0,
    poll: float = 0.0,
) -> Series:
    """``poll``: the worker's poll interval when it has no notifications; the idle gap is then
    stretched by a random part of it, so enqueues land at random phases of the poll loop."""
    marks = Marks(proc)
    try:
        if not marks.ready.wait(120):  # a loaded machine starts a worker slowly
            raise RuntimeError("the worker did not start")
        time.sleep(0.5)  # let it settle into its idle wait
        for _ in range(count):
            time.sleep(random.uniform(0.05, 0.25) + random.uniform(0, poll))
            sent = time.time()
            handle = enqueue()
            returned = time.time()
            series.add(sent, returned, marks.next(timeout))
            if after is not None:
                after(handle)
    except Exception as exc:
        series.error = (str(exc) or type(exc).__name__).splitlines()[0][:120]
        console.print(f"[red]{series.system} {series.config}: {series.error}[/red]")
    finally:
        marks.stop()
    if series.samples:
        console.print(
            f"  {series.system:16} {series.config:48} p50 "
            f"{percentile(series.samples, 50):8.2f} ms  ({len(series.samples)} samples)"
        )
    return series


# -- systems ------------------------------------------------------------------------------


BARE_TABLE = "CREATE TABLE IF NOT EXISTS public.bare_enqueued (id bigserial PRIMARY KEY)"
# One statement, autocommit: the insert makes the commit flush WAL, as a durable enqueue's does.
BARE_DURABLE = (
    "WITH job AS (INSERT INTO public.bare_enqueued DEFAULT VALUES RETURNING id) "
    "SELECT pg_notify('bench_bare', id::text) FROM job"
)


def bare(url: str, count: int) -> Series:
    proc = spawn([python(), "-m", "bench.peers", "bare", "serve", "--url", url])
    with psycopg.connect(url, autocommit=True) as conn:
        return sample(
            Series("bare LISTEN/NOTIFY", "NOTIFY, autocommit", ceiling=True),
            proc,
            count,
            lambda: conn.execute("NOTIFY bench_bare"),
        )


def bare_durable(url: str, count: int) -> Series:
    proc = spawn([python(), "-m", "bench.peers", "bare", "serve", "--url", url])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BARE_TABLE)
        return sample(
            Series("bare LISTEN/NOTIFY", "INSERT a row + NOTIFY, one statement"),
            proc,
            count,
            lambda: conn.execute(BARE_DURABLE),
        )


def ours(url: str, count: int, *, listen: bool, poll: float) -> tuple[Series, Series]:
    from sync import Engine

    args = ["--mode", "serve", "--poll-interval", str(poll)]
    if not listen:
        args.append("--no-listen")
    proc = spawn([python(), "-m", "bench.worker", "--url", url, *args])
    how = f"LISTEN/NOTIFY, poll {poll:g} s" if listen else f"polling only, every {poll:g} s"
    claimed = Series("connector-sync", f"{how}: claimed", ours=listen)
    series = Series("connector-sync", f"{how}: connector started", ours=listen)
    with Engine(settings_for(url), pool_size=3) as engine, connect(url) as conn:
        connection_id = engine.connections()[0].id
        marks: dict[int, tuple[float, float]] = {}

        def enqueue() -> int:
            sent = time.time()
            run_id = engine.sync(connection_id).id
            marks[run_id] = (sent, time.time())
            return run_id

        def after(run_id: int) -> None:
            # Idle means the previous run is over: wait for it, then read its claim time.
            deadline = time.time() + 10
            while time.time() < deadline:
                row = conn.execute(
                    "SELECT r.status, extract(epoch FROM a.started_at) FROM connection_runs r "
                    "JOIN run_attempts a ON a.run_id = r.id WHERE r.id = %s",
                    (run_id,),
                ).fetchone()
                if row and row[0] not in ("queued", "running"):
                    claimed.add(*marks[run_id], float(row[1]))
                    return
                time.sleep(0.005)
            raise RuntimeError(f"run {run_id} did not finish")

        sample(
            series, proc, count, enqueue, after=after, timeout=poll + 10, poll=0 if listen else poll
        )
    return claimed, series


def ours_jobs(url: str, count: int) -> Series:
    """An application job: sent with ``engine.queues.send``, started in a lane of a worker
    process (``Worker.run()``, LISTEN/NOTIFY, poll 2 s) when its handler is called."""
    from bench import app_jobs
    from sync import Engine

    proc = spawn([python(), "-m", "bench.app_jobs", "--url", url, "--mode", "serve"])
    with Engine(settings_for(url), pool_size=3) as engine:
        app_jobs.declare(engine.queues)
        return sample(
            Series("connector-sync jobs", "LISTEN/NOTIFY, poll 2 s: handler called", ours=True),
            proc,
            count,
            lambda: engine.queues.send(app_jobs.QUEUE, {}),
        )


def procrastinate(url: str, count: int) -> Series:
    import procrastinate as pc

    proc = spawn([python(), "-m", "bench.peers", "procrastinate", "serve", "--url", url])
    app = pc.App(connector=pc.SyncPsycopgConnector(conninfo=url))
    with app.open():
        task = app.configure_task("noop", queue="bench")
        return sample(
            Series("procrastinate", "LISTEN/NOTIFY (default), concurrency 1"),
            proc,
            count,
            lambda: task.defer(seq=0),
        )


def pgqueuer(url: str, count: int) -> Series:
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.adapters.persistence.queries import SyncQueries

    proc = spawn([python(), "-m", "bench.peers", "pgqueuer", "serve", "--url", url])
    with psycopg.connect(url, autocommit=True) as conn:
        queries = SyncQueries(SyncPsycopgDriver(conn))
        return sample(
            Series("pgqueuer", "LISTEN/NOTIFY (default), batch_size 1"),
            proc,
            count,
            lambda: queries.enqueue("noop", None),
        )


def _node(peer: str, url: str, poll_ms: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["node", str(NODE_DIR / "peers.mjs"), "serve", peer, as_uri(url), str(poll_ms)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=NODE_DIR,
    )


def graphile(url: str, count: int) -> Series:
    proc = _node("graphile", url, 2000)
    with psycopg.connect(url, autocommit=True) as conn:
        return sample(
            Series("graphile-worker", "LISTEN/NOTIFY (default), concurrency 1"),
            proc,
            count,
            lambda: conn.execute("SELECT graphile_worker.add_job('noop')"),
        )


def pgboss(url: str, count: int) -> Series:
    proc = _node("pgboss", url, 500)
    with psycopg.connect(url, autocommit=True) as conn:
        return sample(
            Series("pg-boss", "polling only, every 0.5 s (its minimum)"),
            proc,
            count,
            # pg-boss 10 has no SQL API; its send() inserts a row like this one.
            lambda: conn.execute("INSERT INTO pgboss.job (name, data) VALUES ('noop', '{}')"),
            poll=0.5,
        )


def _setup_peers(url: str) -> list[str]:
    from bench.claim import _setup_python_peer
    from bench.common import run_node

    failed = []
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("procrastinate", lambda: _setup_python_peer(url, "procrastinate")),
        ("pgqueuer", lambda: _setup_python_peer(url, "pgqueuer")),
        ("graphile", lambda: run_node(["setup", "graphile", as_uri(url)], timeout=120)),
        ("pgboss", lambda: run_node(["setup", "pgboss", as_uri(url)], timeout=120)),
    ]
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            console.print(f"[red]{name} setup failed: {exc}[/red]")
            failed.append(name)
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, help="samples per notified system (default 100)")
    parser.add_argument("--no-peers", action="store_true")
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    n = args.samples or (10 if args.quick else 100)
    # Polling at 2 s costs about two seconds a sample.
    n_slow = 3 if args.quick else max(5, n // 4)

    with scratch_database("latency") as url:
        console.print(
            f"[bold]bench.latency[/bold]: {n} samples per system ({n_slow} at 2 s polling)"
        )
        machine = machine_info(url)
        console.print(machine_line(machine))
        from sync import Engine

        with Engine(settings_for(url), pool_size=3) as engine:
            engine.migrate()
            ws = engine.create_workspace("latency")
            engine.create_connection(ws.id, "mark", "bench_start_mark")
        failed = [] if args.no_peers else _setup_peers(url)

        results: list[Series] = [bare(url, n), bare_durable(url, n)]
        results.extend(ours(url, n, listen=True, poll=2.0))
        results.extend(ours(url, n_slow, listen=False, poll=2.0))
        results.extend(ours(url, n, listen=False, poll=0.1))
        results.append(ours_jobs(url, n))
        if not args.no_peers:
            for name, fn in (
                ("procrastinate", procrastinate),
                ("pgqueuer", pgqueuer),
                ("graphile", graphile),
                ("pgboss", pgboss),
            ):
                if name not in failed:
                    results.append(fn(url, n))
        results.append(bare(url, n))  # again: the machine may have drifted meanwhile

    report(results)
    print_json(
        "latency",
        args,
        [
            {
                "system": s.system,
                "configuration": s.config,
                "n": len(s.samples),
                **{f"p{q}_ms": percentile(s.samples, q) for q in (50, 95, 99)},
                "p50_ms_from_enqueue_return": percentile(s.from_return, 50),
                "enqueue_p50_ms": percentile(s.enqueue_ms, 50),
                "samples_ms": s.samples,
                "error": s.error or None,
            }
            for s in results
        ],
        machine=machine,
    )


def report(results: list[Series]) -> None:
    ceilings = [percentile(s.samples, 50) for s in results if s.ceiling and s.samples]
    ceiling = min(ceilings) if ceilings else float("nan")
    ours_p50 = next(
        (percentile(s.samples, 50) for s in results if s.ours and "started" in s.config),
        float("nan"),
    )
    rows = []
    for s in results:
        if not s.samples:
            rows.append([s.system, s.config, 0, "error", s.error, "", "", "", "", ""])
            continue
        p50 = percentile(s.samples, 50)
        rows.append(
            [
                s.system,
                s.config,
                len(s.samples),
                f"{p50:.2f}",
                f"{percentile(s.samples, 95):.2f}",
                f"{percentile(s.samples, 99):.2f}",
                f"{percentile(s.from_return, 50):.2f}",
                f"{percentile(s.enqueue_ms, 50):.2f}",
                ratio(p50, ours_p50),
                ratio(p50, ceiling),
            ]
        )
    print_table(
        "Enqueue-to-start latency, idle worker (ms, from before the enqueue was sent)",
        [
            Column("system", "left"),
            Column("configuration: start mark", "left"),
            "n",
            "p50",
            "p95",
            "p99",
            "p50 from the enqueue's return (old mark)",
            "enqueue p50",
            "p50 x ours",
            "p50 x bare",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
