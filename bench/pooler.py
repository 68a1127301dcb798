"""Workers straight to Postgres against workers behind PgBouncer in transaction pooling mode, in
one run: drain rate, enqueue-to-start and the Postgres backends the fleet holds.

    python -m bench.pooler [--workers 4,16,32] [--job-ms 20] [--pool-size 20] [--json]

Each worker is a real ``Worker.run()`` process (``bench.worker --mode serve``, pool of 4), on the
"many workspaces" mix of ``bench.fleet`` (every run in a workspace of its own, a connector that
waits ``--job-ms`` on its provider), measured by the same drain and load phases. Three set-ups
for each number of workers:

- direct: ``DATABASE_URL`` is Postgres, wake-ups by LISTEN/NOTIFY (the default deployment);
- PgBouncer + listen_url: ``DATABASE_URL`` is PgBouncer (``pool_mode = transaction``,
  ``default_pool_size = --pool-size``), ``CONNECTOR_SYNC_POOLER=transaction``, and
  ``CONNECTOR_SYNC_LISTEN_URL`` Postgres itself, so each worker keeps one direct session to
  LISTEN on;
- PgBouncer, polling: the same without ``listen_url``: no direct session, wake-ups by the 2 s
  poll alone.

"backends" is the most Postgres client backends of the benchmark's database seen at once
during the drain (sampled every 20 ms), the benchmark's own few included: what the fleet costs
the server's ``max_connections``.

It starts a private Postgres (``max_connections = 400``, as ``bench.fleet``) and a private
PgBouncer in front of it (tests/pgbouncer.py, Debian's ``pgbouncer``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import (
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
from bench.fleet import (
    MIXES,
    Cpu,
    Point,
    backlog_size,
    connection_ids,
    drain,
    load,
    server,
    setup_mix,
)
from tests.pgbouncer import PgBouncer

MIX = MIXES[0]  # many workspaces: the claimers never meet on a workspace row
SETUPS = ("direct", "PgBouncer + listen_url", "PgBouncer, polling")


@dataclass
class Result:
    setup: str
    workers: int
    point: Point
    backends: int = 0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Backends(threading.Thread):
    """The most client backends of the database seen at once, every 20 ms."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(url)
        self.most = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(0.02):
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend'"
            ).fetchone()
            self.most = max(self.most, int(row[0]) if row else 0)

    def stop(self) -> int:
        self._stopping.set()
        self.join()
        self.conn.close()
        return self.most


def start_fleet(url: str, direct: str, count: int, setup: str) -> list[subprocess.Popen[str]]:
    env = {}
    if setup != "direct":
        env["CONNECTOR_SYNC_POOLER"] = "transaction"
        if setup == "PgBouncer + listen_url":
            env["CONNECTOR_SYNC_LISTEN_URL"] = direct
    procs = [
        spawn([python(), "-m", "bench.worker", "--url", url, "--mode", "serve"], env=env)
        for _ in range(count)
    ]
    try:
        wait_ready(procs, direct, setup)
    except BaseException:
        stop_fleet(procs)
        raise
    return procs


def wait_ready(procs: list[subprocess.Popen[str]], direct: str, setup: str) -> None:
    count = len(procs)
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"a worker did not start: {line!r}")
    # Ready: registered, and (when it listens) its LISTEN session idle on Postgres.
    listens = 0 if setup == "PgBouncer, polling" else count
    deadline = time.monotonic() + 120
    with connect(direct) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM workers WHERE stopped_at IS NULL), "
                "(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "   AND application_name LIKE '%%/listen' AND state = 'idle')"
            ).fetchone()
            if row is not None and row[0] >= count and row[1] >= listens:
                return
            time.sleep(0.1)
    raise RuntimeError("the workers did not all register (and LISTEN)")


def stop_fleet(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure(
    direct: str, bouncer: PgBouncer, setup: str, n: int, ids: list[int], args: argparse.Namespace
) -> Result:
    url = direct if setup == "direct" else bouncer.url
    result = Result(setup, n, Point(setup, MIX.name, n))
    procs = start_fleet(url, direct, n, setup)
    try:
        cpu = Cpu([p.pid for p in procs], None)
        backends = Backends(direct)
        backends.start()
        try:
            drain(direct, ids[: backlog_size(n, True)], result.point.drain, cpu)
        finally:
            result.backends = backends.stop()
        count = max(50, min(args.samples, int(result.point.drain.rate * args.load * 10)))
        load(direct, ids[:count], result.point.drain.rate * args.load, result.point.load, cpu)
    except Exception as exc:
        result.error = (str(exc) or type(exc).__name__).splitlines()[0][:120]
        console.print(f"[red]{setup}, {n} workers: {result.error}[/red]")
    finally:
        stop_fleet(procs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="4,16,32", help="worker counts (4,16,32)")
    parser.add_argument("--job-ms", type=float, default=20.0, help="each run's wait (20 ms)")
    parser.add_argument("--load", type=float, default=0.5, help="load phase, x drain rate (0.5)")
    parser.add_argument("--samples", type=int, default=150, help="runs per load phase (150)")
    parser.add_argument(
        "--pool-size", type=int, default=20, help="PgBouncer's default_pool_size (20)"
    )
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    counts = [int(n) for n in args.workers.split(",")]
    results: list[Result] = []

    with server(False) as (base, _postmaster):
        os.environ["DATABASE_URL"] = base
        with scratch_database("pooler") as direct:
            machine = machine_info(direct)
            console.print(
                f"[bold]bench.pooler[/bold]: {', '.join(map(str, counts))} workers, runs "
                f"waiting {args.job_ms:g} ms, PgBouncer default_pool_size {args.pool_size}"
            )
            console.print(machine_line(machine))
            migrate(direct)
            per_setup = max(backlog_size(max(counts), True), args.samples)
            setup_mix(direct, MIX, per_setup, args.job_ms)
            with connect(direct) as conn:
                conn.execute("VACUUM ANALYZE")
            ids = connection_ids(direct, MIX)
            pool = args.pool_size
            with PgBouncer(direct, pool_size=pool, max_server_connections=pool) as bouncer:
                for n in counts:
                    for setup in SETUPS:
                        result = measure(direct, bouncer, setup, n, ids, args)
                        results.append(result)
                        if not result.error:
                            p = result.point
                            console.print(
                                f"  {setup:24} {n:>2} workers: {p.drain.rate:7,.0f} runs/s, "
                                f"p95 {percentile(p.load.latencies_ms, 95):7.1f} ms, "
                                f"{result.backends} backends"
                            )
            machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]

    report(results)
    print_json("pooler", args, [_json(r) for r in results], machine=machine)


def report(results: list[Result]) -> None:
    direct = {r.workers: r for r in results if r.setup == "direct" and not r.error}
    rows = []
    for r in results:
        if r.error:
            rows.append([r.setup, r.workers, "", "", "", "", "", r.error])
            continue
        base = direct.get(r.workers)
        lat = r.point.load.latencies_ms
        rows.append(
            [
                r.setup,
                r.workers,
                f"{r.point.drain.rate:,.0f}",
                ratio(r.point.drain.rate, base.point.drain.rate) if base else "",
                f"{percentile(lat, 50):.1f}",
                f"{percentile(lat, 95):.1f}",
                r.backends,
                "",
            ]
        )
    print_table(
        "Workers direct and behind PgBouncer (transaction mode), many workspaces",
        [
            "set-up",
            "workers",
            "drain runs/s",
            "x direct",
            "p50 start ms",
            "p95 start ms",
            "backends",
            "error",
        ],
        rows,
    )


def _json(r: Result) -> dict[str, Any]:
    lat = r.point.load.latencies_ms
    return {
        "setup": r.setup,
        "workers": r.workers,
        "drain_runs_per_s": None if r.error else r.point.drain.rate,
        "p50_start_ms": percentile(lat, 50) if lat else None,
        "p95_start_ms": percentile(lat, 95) if lat else None,
        "backends": r.backends,
        "worker_cpu_s_per_run": r.point.drain.per_run(r.point.drain.worker_cpu_s),
        "error": r.error or None,
    }


if __name__ == "__main__":
    main()
