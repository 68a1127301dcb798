"""What a backlog of runs no worker can take costs the claims of the workers that pass it.

A worker claims only syncs of the providers it has installed. Runs of a provider no live worker
has stay queued, and a claim walking the queue in (queued_at, id) order steps past those ahead
of the first run it can take, as it steps past lane-blocked runs. This measures ``claim_run``
with N runs of a provider the claiming worker lacks, due and older than the 5 runs it can take,
for N = 0, 100, 1,000 and 10,000; beside it, the same claim by a worker that has every provider
(it takes the oldest run at once).

    python -m bench.unserved [--claims N] [--json]

Each claim is the worker's own statement (``QUERIES.claim_run``) in a transaction that is rolled
back, so every claim sees the same queue; the client times the statement.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row

from bench.common import (
    Column,
    add_json_option,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    median,
    migrate,
    percentile,
    print_json,
    print_table,
    ratio,
    scratch_database,
)

SERVED = ["bench_noop"]
LEASE = timedelta(seconds=120)
BASE = [
    "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 20) g",
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g % 20, 'c' || g, 'bench_noop' FROM generate_series(1, 5) g",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status) "
    "SELECT id, workspace_id, provider, 'queued' FROM connections",
]
# N more runs, of a provider no claiming worker has, queued an hour ago: ahead of the 5 above.
UNSERVED = [
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g %% 20, 'absent' || g, 'bench_absent' "
    "  FROM generate_series(%(first)s::int, %(last)s::int) g",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at) "
    "SELECT id, workspace_id, provider, 'queued', now() - interval '1 hour' + id * interval '1 ms' "
    "  FROM connections WHERE name LIKE 'absent%%' AND NOT EXISTS "
    "       (SELECT 1 FROM connection_runs r WHERE r.connection_id = connections.id)",
]


def claims(url: str, count: int) -> tuple[list[float], list[float]]:
    """``count`` claims by a worker lacking the unserved provider and as many by one that has
    every provider, interleaved so that both meet the same load on a shared machine."""
    from sync.store.queries import QUERIES

    timings: dict[bool, list[float]] = {True: [], False: []}
    with connect(url) as conn:
        cursor = conn.cursor(row_factory=dict_row)
        for round_ in range(20 + count):  # the first 20 compile the function, untimed
            for lacking in (True, False):
                providers = SERVED if lacking else None
                params = {
                    "worker_id": "bench",
                    "lease": LEASE,
                    "providers": providers,
                    "wakeable": False,
                }
                with conn.transaction(force_rollback=True):
                    start = time.perf_counter()
                    row = cursor.execute(QUERIES.claim_run, params).fetchone()
                    elapsed = 1000 * (time.perf_counter() - start)
                if row is None or (lacking and row["provider"] not in SERVED):
                    raise RuntimeError("the claim did not take a run it can execute")
                if round_ >= 20:
                    timings[lacking].append(elapsed)
    return timings[True], timings[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=300, help="timed claims per size")
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    results: list[dict[str, Any]] = []
    with scratch_database("unserved") as url:
        console.print(f"[bold]bench.unserved[/bold]: {args.claims} claims per size")
        machine = machine_info(url)
        console.print(machine_line(machine))
        migrate(url)
        with connect(url) as conn:
            for statement in BASE:
                conn.execute(statement)
        have = 0
        for size in (0, 100, 1_000, 10_000):
            with connect(url) as conn:
                if size > have:
                    for statement in UNSERVED:
                        conn.execute(statement, {"first": have + 1, "last": size})
                have = size
                conn.execute("VACUUM ANALYZE connection_runs")
            lacking, having = claims(url, args.claims)
            results.append(
                {
                    "unserved_ahead": size,
                    "lacking_p50_ms": median(lacking),
                    "lacking_p95_ms": percentile(lacking, 95),
                    "having_p50_ms": median(having),
                }
            )
            console.print(f"  {size:>6,} ahead: p50 {median(lacking):.3f} ms")
    reference = results[0]["lacking_p50_ms"]
    print_table(
        f"claim_run behind runs no claiming worker can take ({args.claims} claims, rolled back)",
        [
            Column("runs ahead it cannot take", "left"),
            "p50 ms",
            "p95 ms",
            "x none ahead",
            "p50 ms, a worker that has them",
        ],
        [
            [
                f"{r['unserved_ahead']:,}",
                f"{r['lacking_p50_ms']:.3f}",
                f"{r['lacking_p95_ms']:.3f}",
                ratio(r["lacking_p50_ms"], reference),
                f"{r['having_p50_ms']:.3f}",
            ]
            for r in results
        ],
    )
    print_json("unserved", args, results, machine=machine)


if __name__ == "__main__":
    main()
