"""Claim cost as history grows: the latency of ``claim_run`` with 10 k, 100 k and 1 M finished
runs in ``connection_runs``, with 10 k queued-but-not-due runs, and right after 100 k runs went
through the queue with no VACUUM since (their dead index entries still in the claim's index),
and over a backlog of lane-blocked runs: N runs of one provider queued in one workspace while
another run of that lane is running, so the limiter holds every one of them back.

    python -m bench.scale [--quick] [--claims N]

History is generated with ``generate_series`` in SQL, not through the API. Each claim is the
worker's own statement (``QUERIES.claim_run``) in a transaction that is rolled back, so every
claim sees the same state; the client times the statement. ``claim_run`` is a plpgsql function,
so its plan is read from auto_explain (``log_nested_statements``, ``log_level = notice``,
``log_analyze``, ``log_buffers``): the plan of each statement inside it, as it really ran.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from typing import Any

import psycopg

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
from sync.store.queries import QUERIES

BASE = [
    "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 20) g",
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g % 20, 'c' || g, 'bench_noop' FROM generate_series(1, 200) g",
    # Five runs due now: the claim has something to take.
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status) "
    "SELECT id, workspace_id, provider, 'queued' FROM connections WHERE id <= 5",
]

# Finished history, spread over 30 days, all statuses.
HISTORY = """
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at,
                             started_at, finished_at, attempts)
SELECT 6 + g %% 195, 1 + (6 + g %% 195) %% 20, 'bench_noop',
       (ARRAY['succeeded', 'failed', 'cancelled', 'partial'])[1 + g %% 4],
       now() - interval '30 days' + g * interval '1 second' / 40,
       now() - interval '30 days' + g * interval '1 second' / 40,
       now() - interval '30 days' + g * interval '1 second' / 40 + interval '5 seconds', 1
  FROM generate_series(1, %(count)s) g
"""

# Runs queued for later (a retry's backoff, a schedule far ahead): in the claim's partial
# index, but not due. One per connection (the unique index allows no more), so 10 k connections.
NOT_DUE = [
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g %% 20, 'later' || g, 'bench_noop' FROM generate_series(1, %(count)s) g",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at) "
    "SELECT id, workspace_id, provider, 'queued', now() + interval '1 hour' + id * interval '1 ms' "
    "FROM connections WHERE name LIKE 'later%%'",
]
NOT_DUE_UNDO = [
    "DELETE FROM connection_runs WHERE connection_id IN "
    "(SELECT id FROM connections WHERE name LIKE 'later%%')",
    "DELETE FROM connections WHERE name LIKE 'later%%'",
]

# Runs that went through the queue (inserted queued, then finished) with no VACUUM since: the
# old versions' entries are still in the claim's partial index. connection_id is NULL (the
# connection was deleted), which the one-active-run index allows any number of times.
CHURN = [
    "ALTER TABLE connection_runs SET (autovacuum_enabled = off)",
    # Without the lane triggers: no run of these lanes is running, so none would be parked,
    # and each row's probe of its lane would be planned on statistics from before the insert.
    "SET session_replication_role = replica",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at) "
    "SELECT NULL, 1 + g %% 20, 'bench_noop', 'queued', "
    "       now() - interval '2 days' + g * interval '1 ms' "
    "  FROM generate_series(1, %(count)s) g",
    "UPDATE connection_runs SET status = 'succeeded', finished_at = now() "
    "WHERE connection_id IS NULL AND status = 'queued'",
    "RESET session_replication_role",
]


def exec_all(conn: psycopg.Connection[Any], statements: list[str], **params: Any) -> None:
    for statement in statements:
        conn.execute(statement, params or None)


# A lane held by a running run, with a backlog behind it: one workspace, one provider, one run
# running under a live lease, %(count)s more queued and due, older than every other queued run,
# so the claim meets them first in (queued_at, id) order.
BLOCKED = [
    "INSERT INTO workspaces (name) VALUES ('blocked')",
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT (SELECT id FROM workspaces WHERE name = 'blocked'), 'blocked' || g, 'bench_lane' "
    "  FROM generate_series(0, %(count)s) g",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at, "
    "                             started_at, attempts, lease_owner, lease_expires_at, worker_id) "
    "SELECT id, workspace_id, provider, 'running', now() - interval '2 hours', now(), 1, "
    "       gen_random_uuid(), now() + interval '1 day', 'bench-elsewhere' "
    "  FROM connections WHERE name = 'blocked0'",
    "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at) "
    "SELECT id, workspace_id, provider, 'queued', now() - interval '1 hour' + id * interval '1 ms' "
    "  FROM connections WHERE name LIKE 'blocked%%' AND name <> 'blocked0'",
]
BLOCKED_UNDO = [
    "DELETE FROM connection_runs WHERE workspace_id = (SELECT id FROM workspaces "
    "WHERE name = 'blocked')",
    "DELETE FROM connections WHERE name LIKE 'blocked%%'",
    "DELETE FROM workspaces WHERE name = 'blocked'",
]
# The five due runs of BASE, moved an hour ahead and back: with them away, nothing but the
# blocked backlog is due (a worker's idle poll).
BASE_AWAY = "UPDATE connection_runs SET queued_at = queued_at + interval '1 hour' WHERE " + (
    "status = 'queued' AND connection_id <= 5"
)
BASE_BACK = "UPDATE connection_runs SET queued_at = queued_at - interval '1 hour' WHERE " + (
    "status = 'queued' AND connection_id <= 5"
)


PARAMS = {
    "worker_id": "bench-scale",
    "lease": timedelta(seconds=120),
    "providers": None,
    "wakeable": False,
}


def claim_latencies(url: str, claims: int, *, expect_run: bool = True) -> list[float]:
    params = PARAMS
    query = QUERIES.claim_run
    timings = []
    with connect(url) as conn:
        for _ in range(claims):
            with conn.transaction(force_rollback=True):
                start = time.perf_counter()
                row = conn.execute(query, params).fetchone()
                timings.append(1000 * (time.perf_counter() - start))
                if (row is not None) != expect_run:
                    raise RuntimeError(
                        "the claim found nothing to claim" if expect_run else "the claim took a run"
                    )
    return timings


def claim_plans(url: str) -> list[dict[str, Any]]:
    """The plans of the statements inside one claim, from auto_explain."""
    notices: list[str] = []
    with connect(url) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_format = json",
            "SET auto_explain.log_analyze = on",
            "SET auto_explain.log_buffers = on",
            "SET auto_explain.log_timing = on",
            "SET auto_explain.log_level = notice",
        ):
            conn.execute(setting)
        # A first claim compiles the plpgsql function and warms the catalog caches; explain
        # the second, as a worker's claims are.
        for _ in range(2):
            notices.clear()
            with conn.transaction(force_rollback=True):
                conn.execute(QUERIES.claim_run, PARAMS).fetchone()
    return [json.loads(m[m.index("{") :]) for m in notices if "{" in m]


def render(plan: dict[str, Any], depth: int = 0) -> list[str]:
    """A compact EXPLAIN (ANALYZE, BUFFERS) tree."""
    what = plan["Node Type"]
    if plan.get("Index Name"):
        what += f" using {plan['Index Name']}"
    if plan.get("Relation Name"):
        what += f" on {plan['Relation Name']}"
    if plan.get("Alias") and plan.get("Alias") != plan.get("Relation Name"):
        what += f" {plan['Alias']}"
    facts = [
        f"rows={plan.get('Actual Rows', '?')} loops={plan.get('Actual Loops', '?')}",
        f"time={plan.get('Actual Total Time', 0):.3f} ms",
        f"buffers hit={plan.get('Shared Hit Blocks', 0)} read={plan.get('Shared Read Blocks', 0)}",
    ]
    for key in ("Rows Removed by Filter", "Rows Removed by Index Recheck", "Heap Fetches"):
        if plan.get(key):
            facts.append(f"{key.lower()}={plan[key]}")
    lines = [f"{'  ' * depth}-> {what}  ({', '.join(facts)})"]
    for key in ("Index Cond", "Filter"):
        if plan.get(key):
            lines.append(f"{'  ' * depth}     {key}: {plan[key][:110]}")
    for child in plan.get("Plans", []):
        lines.extend(render(child, depth + 1))
    return lines


def describe_plans(plans: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The candidate query's full tree, a line for every other statement, and the total of
    shared buffers the whole claim touched."""
    lines: list[str] = []
    total_buffers = 0
    for item in plans:
        text = " ".join(item["Query Text"].split())
        plan = item["Plan"]
        buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
        if "LEFT JOIN LATERAL claimed_run_extras_v1" in text:
            # The outer statement: its buffers include everything the function did.
            total_buffers = buffers
            lines.append("outer statement (claim_run() joined to its connection):")
            lines.extend(render(plan, 1))
            continue
        if "SKIP LOCKED" in text:
            lines.append("candidate query (SELECT ... FOR NO KEY UPDATE OF r, w SKIP LOCKED):")
            lines.extend(render(plan, 1))
        else:
            lines.append(
                f"{text[:70]}...: {plan.get('Actual Total Time', 0):.3f} ms, {buffers} buffers"
            )
    return lines, total_buffers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 k and 100 k only")
    parser.add_argument("--claims", type=int, help="timed claims per size (default 300)")
    parser.add_argument(
        "--blocked",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        help="lane-blocked backlog sizes, comma-separated (default 1000 quick, 1000,10000 full)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    claims = args.claims or (50 if args.quick else 300)
    sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
    blocked_sizes = args.blocked or ((1_000,) if args.quick else (1_000, 10_000))
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    plans_out: list[tuple[str, list[str]]] = []

    with scratch_database("scale") as url:
        console.print(f"[bold]bench.scale[/bold]: {claims} claims per size")
        machine = machine_info(url)
        console.print(machine_line(machine))
        migrate(url)
        with connect(url) as conn:
            exec_all(conn, BASE)
        have = 0
        reference = float("nan")

        def measure(label: str, finished: int, *, expect_run: bool = True) -> None:
            nonlocal reference
            with connect(url) as conn:
                conn.execute("VACUUM ANALYZE connection_runs")
            timings = claim_latencies(url, claims, expect_run=expect_run)
            p50 = median(timings)
            if reference != reference:
                reference = p50
            lines, buffers = describe_plans(claim_plans(url))
            rows.append(
                [
                    label,
                    f"{finished:,}",
                    f"{p50:.3f}",
                    f"{percentile(timings, 95):.3f}",
                    buffers,
                    ratio(p50, reference),
                ]
            )
            plans_out.append((label, lines))
            results.append(
                {
                    "history": label.strip(),
                    "runs_in_table": finished,
                    "p50_ms": p50,
                    "p95_ms": percentile(timings, 95),
                    "buffers_per_claim": buffers,
                    "p50_x_10k": p50 / reference,
                }
            )
            console.print(f"  {label:45} p50 {p50:.3f} ms, {buffers} buffers")

        for size in sizes:
            with connect(url) as conn:
                conn.execute(HISTORY, {"count": size - have})
            have = size
            measure(f"{size:,} finished runs", have)
            if size == sizes[0]:
                # An idle poll: the same claim with nothing due, the reference for the
                # lane-blocked claims below that also end with nothing.
                with connect(url) as conn:
                    conn.execute(BASE_AWAY)
                measure(f"{size:,} finished, nothing due", have, expect_run=False)
                with connect(url) as conn:
                    conn.execute(BASE_BACK)
                with connect(url) as conn:
                    exec_all(conn, NOT_DUE, count=10_000)
                measure(f"{size:,} finished + 10,000 queued, not due", have)
                with connect(url) as conn:
                    exec_all(conn, NOT_DUE_UNDO)
                for count in blocked_sizes:
                    with connect(url) as conn:
                        exec_all(conn, BLOCKED, count=count)
                    measure(f"{size:,} finished + {count:,} lane-blocked, then 5 due", have)
                    with connect(url) as conn:
                        conn.execute(BASE_AWAY)
                    measure(
                        f"{size:,} finished + {count:,} lane-blocked, nothing else due",
                        have,
                        expect_run=False,
                    )
                    with connect(url) as conn:
                        conn.execute(BASE_BACK)
                        exec_all(conn, BLOCKED_UNDO)

        # Churn without VACUUM: measured without the VACUUM the other sizes get.
        churn = 100_000
        with connect(url) as conn:
            exec_all(conn, CHURN, count=churn)
            conn.execute("ANALYZE connection_runs")
        lines, first_buffers = describe_plans(claim_plans(url))
        plans_out.append((f"first claim after {churn:,} runs finished, no VACUUM since", lines))
        timings = claim_latencies(url, claims)
        rows.append(
            [
                f"+{churn:,} runs queued then finished, no VACUUM (first claim)",
                f"{have + churn:,}",
                "-",
                "-",
                first_buffers,
                "",
            ]
        )
        lines, buffers = describe_plans(claim_plans(url))
        rows.append(
            [
                "  the claims after it",
                f"{have + churn:,}",
                f"{median(timings):.3f}",
                f"{percentile(timings, 95):.3f}",
                buffers,
                ratio(median(timings), reference),
            ]
        )
        plans_out.append(("the claims after it", lines))
        results.append(
            {
                "history": f"+{churn:,} runs queued then finished, no VACUUM",
                "runs_in_table": have + churn,
                "first_claim_buffers": first_buffers,
                "p50_ms": median(timings),
                "p95_ms": percentile(timings, 95),
                "buffers_per_claim": buffers,
                "p50_x_10k": median(timings) / reference,
            }
        )

    for label, lines in plans_out:
        console.print(f"\n[bold]claim plan: {label}[/bold]")
        for line in lines:
            console.print(line, markup=False, highlight=False)
    print_table(
        f"claim_run latency as history grows ({claims} claims each, rolled back)",
        [
            Column("history", "left"),
            "runs in table",
            "p50 ms",
            "p95 ms",
            "buffers/claim",
            "p50 x 10 k",
        ],
        rows,
    )
    print_json("scale", args, results, machine=machine, plans=dict(plans_out))


if __name__ == "__main__":
    main()
