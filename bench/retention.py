"""Retention at scale: a history of finished runs older than ``history_days``, made by SQL,
pruned in bounded batches while worker processes keep claiming, and the size of
``connection_runs`` and its claim index over repeated rounds of churn, with and without prune.

    python -m bench.retention [--quick] [--history N] [--claimers K] [--rounds R]

1. History: N finished runs (default 1,000,000), one attempt each, 40 to 100 days old, over
   5,000 connections in 50 workspaces; 1,000 runs queued.
2. Claims: K claimer processes (default 4) loop over the worker's own statements, ``claim_run``
   then ``finish_run``, each finished run's connection queued again at once. Each claim is
   timed by the client. Phases: before the prune, during it (``prune()``, as
   ``connector-sync prune`` and the cleaner run it, on a connection of its own), after it.
3. Churn: R rounds (default 6); each round runs 20 generations of one run per connection
   through the queue (queued, running with an attempt, succeeded) in a schema that is pruned
   after each round and in one that is never pruned, then VACUUMs both (what autovacuum does;
   ``connection_runs`` is set to vacuum every 5,000 changed rows) and measures them. Each round
   stands for a whole ``history_days``: it prunes with the age limit at zero, so every run is old
   enough and the newest 20 runs of each connection are what is kept.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from datetime import timedelta
from multiprocessing.synchronize import Event as EventType
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench.common import (
    Column,
    add_json_option,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    percentile,
    print_json,
    print_table,
    scratch_database,
    settings_for,
)

WORKSPACES = 50
RUNS_PER_CONNECTION = 200  # in the history: the newest 20 of each are kept
QUEUED = 1_000
GENERATIONS = 20  # runs per connection per churn round

SETUP = [
    "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, %(workspaces)s) g",
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g %% %(workspaces)s, 'c' || g, 'bench_noop' "
    "FROM generate_series(1, %(connections)s) g",
]
# Finished history, 40 to 100 days old, spread over every connection (connection g is in
# workspace 1 + g % workspaces), with one attempt per run.
HISTORY = [
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, trigger, "
    "                             queued_at, started_at, finished_at, attempts) "
    "SELECT c, 1 + c %% %(workspaces)s, 'bench_noop', "
    "       (ARRAY['succeeded', 'failed', 'cancelled', 'partial'])[1 + g %% 4], 'history', "
    "       t, t, t + interval '5 seconds', 1 "
    "  FROM generate_series(1, %(count)s) g, "
    "       LATERAL (SELECT 1 + g %% %(connections)s AS c, "
    "                now() - interval '100 days' "
    "                + g * (interval '60 days' / %(count)s) AS t) x",
    "INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id, started_at, "
    "                          finished_at, outcome) "
    "SELECT id, 1, gen_random_uuid(), 'bench', started_at, finished_at, status "
    "  FROM connection_runs WHERE trigger = 'history'",
]
QUEUE = (
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, trigger) "
    "SELECT id, workspace_id, provider, 'queued', 'bench' FROM connections "
    "ORDER BY id LIMIT %(count)s"
)
REQUEUE = (
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, trigger) "
    "VALUES (%(connection_id)s, %(workspace_id)s, %(provider)s, 'queued', 'bench')"
)
# One generation of churn: a run per connection through the queue, as a worker would move it.
CHURN = [
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, trigger) "
    "SELECT id, workspace_id, provider, 'queued', 'churn' FROM connections "
    "ON CONFLICT (connection_id) WHERE status IN ('queued', 'running') DO NOTHING",
    "UPDATE connection_runs SET status = 'running', attempts = 1, started_at = now(), "
    "       lease_owner = gen_random_uuid(), lease_expires_at = now() + interval '2 minutes', "
    "       worker_id = 'bench' "
    " WHERE status = 'queued' AND trigger = 'churn'",
    "INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id) "
    "SELECT id, 1, lease_owner, 'bench' FROM connection_runs "
    " WHERE status = 'running' AND trigger = 'churn'",
    "UPDATE connection_runs SET status = 'succeeded', finished_at = now(), lease_owner = NULL, "
    "       lease_expires_at = NULL "
    " WHERE status = 'running' AND trigger = 'churn'",
]
SIZES = """
SELECT (SELECT count(*) FROM connection_runs) AS runs,
       pg_relation_size('connection_runs') AS heap,
       pg_relation_size('connection_runs_claimable') AS claimable,
       (public.pgstatindex('connection_runs_claimable')).deleted_pages AS claimable_deleted,
       pg_relation_size('connection_runs_retention') AS retention,
       pg_total_relation_size('run_attempts') AS attempts
"""


def claimer(url: str, worker_id: str, start: float, ready: Any, stop: EventType, out: Any) -> None:
    """Claims and finishes runs until ``stop``, queueing each finished run's connection again;
    sends back (seconds since ``start``, claim ms) for every claim that took a run."""
    from sync.store.queries import QUERIES

    claim = {
        "worker_id": worker_id,
        "lease": timedelta(seconds=120),
        "providers": None,
        "wakeable": False,
    }
    samples: list[tuple[float, float]] = []
    with connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        ready.put(worker_id)
        while not stop.is_set():
            began = time.perf_counter()
            row = cur.execute(QUERIES.claim_run, claim).fetchone()
            took = 1000 * (time.perf_counter() - began)
            if row is None:
                continue
            samples.append((time.time() - start, took))
            cur.execute(
                QUERIES.finish_run,
                {
                    "run_id": row["id"],
                    "lease_owner": row["lease_owner"],
                    "status": "succeeded",
                    "results": Jsonb({}),
                    "attempt_results": Jsonb({}),
                    "error": None,
                    "processed_units": 0,
                    "disconnect": False,
                },
            )
            cur.execute(REQUEUE, row)
    out.put(samples)


def run(url: str, statements: list[str], **params: Any) -> None:
    with connect(url) as conn:
        for statement in statements:
            conn.execute(statement, params or None)


def sizes(url: str, schema: str) -> dict[str, int]:
    with connect(url, schema=schema) as conn:
        conn.execute("VACUUM (ANALYZE) connection_runs")
        conn.execute("VACUUM (ANALYZE) run_attempts")
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(SIZES).fetchone()
    assert row is not None
    return dict(row)


def latency_row(phase: str, samples: list[float], seconds: float) -> list[Any]:
    return [
        phase,
        f"{len(samples):,}",
        f"{len(samples) / seconds:,.0f}" if seconds else "-",
        f"{percentile(samples, 50):.2f}",
        f"{percentile(samples, 95):.2f}",
        f"{max(samples):.1f}" if samples else "-",
    ]


def mb(value: int) -> str:
    return f"{value / 1024 / 1024:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 k runs, 3 rounds, 5 s phases")
    parser.add_argument("--history", type=int, help="finished runs to prune (default 1 M)")
    parser.add_argument("--claimers", type=int, default=4, help="claimer processes (default 4)")
    parser.add_argument("--rounds", type=int, help="churn rounds (default 6)")
    parser.add_argument(
        "--phase-seconds", type=float, help="claims before and after the prune (default 20)"
    )
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    history = args.history or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (3 if args.quick else 6)
    phase = args.phase_seconds or (5.0 if args.quick else 20.0)

    from sync import Engine
    from sync.worker.services import Kind, RetentionRules, prune

    with scratch_database("retention") as url:
        machine = machine_info(url)
        console.print(
            f"[bold]bench.retention[/bold]: {history:,} finished runs, {args.claimers} claimers, "
            f"{rounds} churn rounds"
        )
        console.print(machine_line(machine))
        connections = max(history // RUNS_PER_CONNECTION, QUEUED)
        params = {"workspaces": WORKSPACES, "connections": connections}
        with connect(url, schema=None) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA public")
        for schema in ("sync", "unpruned"):
            with Engine(settings_for(url, schema_name=schema), pool_size=3) as engine:
                engine.migrate()
            run_schema = connect(url, schema=schema)
            for statement in SETUP:
                run_schema.execute(statement, params)
            run_schema.close()
        built = time.perf_counter()
        run(url, HISTORY, count=history, **params)
        run(url, [QUEUE], count=QUEUED)
        before = sizes(url, "sync")
        console.print(
            f"history of {history:,} runs made in {time.perf_counter() - built:.0f} s: "
            f"connection_runs {mb(before['heap'])} MB, run_attempts {mb(before['attempts'])} MB"
        )

        # -- claims before, during and after the prune ------------------------------------
        context = multiprocessing.get_context("spawn")
        stop, ready, out = context.Event(), context.Queue(), context.Queue()
        start = time.time()
        claimers = [
            context.Process(target=claimer, args=(url, f"claimer-{i}", start, ready, stop, out))
            for i in range(args.claimers)
        ]
        for process in claimers:
            process.start()
        for _ in claimers:
            ready.get(timeout=120)
        time.sleep(1 + phase)  # a second to warm up, then the phase before the prune
        pruned_at = time.time() - start
        settings = settings_for(url)
        with Engine(settings, pool_size=2) as engine:
            began = time.perf_counter()
            report = prune(engine.pool, RetentionRules.from_settings(settings))
            prune_seconds = time.perf_counter() - began
        done_at = time.time() - start
        time.sleep(phase)
        stop.set()
        samples = [sample for _ in claimers for sample in out.get(timeout=120)]
        for process in claimers:
            process.join(60)
        windows = {
            "before the prune": (pruned_at - phase, pruned_at),
            "during the prune": (pruned_at, done_at),
            "after the prune": (done_at, done_at + phase),
        }
        latency_rows, latency_results = [], []
        for label, (lo, hi) in windows.items():
            within = [ms for at, ms in samples if lo <= at < hi]
            latency_rows.append(latency_row(label, within, hi - lo))
            latency_results.append(
                {
                    "phase": label,
                    "claims": len(within),
                    "claims_per_s": len(within) / (hi - lo),
                    "p50_ms": percentile(within, 50),
                    "p95_ms": percentile(within, 95),
                    "max_ms": max(within) if within else None,
                }
            )
        deleted = report.deleted[Kind.RUNS] + report.deleted[Kind.ATTEMPTS]
        prune_result = {
            "seconds": prune_seconds,
            "statements": report.statements,
            "deleted": report.counts(),
            "rows_per_s": deleted / prune_seconds,
            "ms_per_statement": 1000 * prune_seconds / report.statements,
        }
        # The claimers' last queued runs go, so every connection takes part in the churn.
        run(
            url,
            [
                "UPDATE connection_runs SET status = 'cancelled', finished_at = now() "
                "WHERE status = 'queued'"
            ],
        )
        after = sizes(url, "sync")

        # -- churn rounds -----------------------------------------------------------------
        churn = RetentionRules(
            history=timedelta(0),
            keep_runs=settings.history_keep_runs,
            stopped_workers=timedelta(days=1),
            tombstones=None,
            batch=settings.retention_batch,
            http_cache=timedelta(days=settings.http_cache_days),
        )
        round_rows, round_results = [], []
        for number in range(1, rounds + 1):
            for schema in ("sync", "unpruned"):
                with connect(url, schema=schema) as conn:
                    for _ in range(GENERATIONS):
                        for statement in CHURN:
                            conn.execute(statement)
            with Engine(settings, pool_size=2) as engine:
                pruned = prune(engine.pool, churn).deleted[Kind.RUNS]
            for schema in ("sync", "unpruned"):
                found = sizes(url, schema)
                round_rows.append(
                    [
                        number,
                        "pruned" if schema == "sync" else "never pruned",
                        f"{found['runs']:,}",
                        mb(found["heap"]),
                        f"{mb(found['claimable'])} ({found['claimable_deleted']:,})",
                        mb(found["retention"]),
                        mb(found["attempts"]),
                        f"{pruned:,}" if schema == "sync" else "-",
                    ]
                )
                round_results.append(
                    {
                        "round": number,
                        "schema": "pruned" if schema == "sync" else "never pruned",
                        **found,
                        "pruned_runs": pruned if schema == "sync" else None,
                    }
                )
            console.print(f"  round {number}: pruned {pruned:,} runs")

    print_table(
        f"claim_run latency while {args.claimers} processes claim and finish, "
        f"{history:,} old runs pruned",
        [Column("phase", "left"), "claims", "claims/s", "p50 ms", "p95 ms", "max ms"],
        latency_rows,
    )
    print_table(
        "the prune",
        [Column("what", "left"), "value"],
        [
            ["runs deleted", f"{report.deleted[Kind.RUNS]:,}"],
            ["attempts deleted", f"{report.deleted[Kind.ATTEMPTS]:,}"],
            ["statements (batches)", f"{report.statements:,}"],
            ["seconds", f"{prune_seconds:.1f}"],
            ["ms per statement", f"{prune_result['ms_per_statement']:.1f}"],
            ["runs + attempts deleted per s", f"{prune_result['rows_per_s']:,.0f}"],
            [
                "connection_runs MB before / after (+VACUUM)",
                f"{mb(before['heap'])} / {mb(after['heap'])}",
            ],
        ],
    )
    print_table(
        f"sizes after each churn round ({GENERATIONS} runs per connection x {connections:,} "
        "connections, then VACUUM), MB",
        [
            "round",
            Column("schema", "left"),
            "runs",
            "connection_runs",
            "claimable index (deleted pages)",
            "retention index",
            "run_attempts",
            "pruned",
        ],
        round_rows,
    )
    print_json(
        "retention",
        args,
        {"claims": latency_results, "prune": prune_result, "rounds": round_results},
        machine=machine,
        history=history,
        before=before,
        after=after,
    )


if __name__ == "__main__":
    main()
