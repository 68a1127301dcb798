"""What a scrape of ``/metrics`` and the connections page cost as run history grows: the median
time of ``Engine.metrics_snapshot()`` and ``Engine.connections_overview()`` with 100 k and 1 M
finished runs, beside the same figures read from the whole history (every run grouped, every
finished run's results summed), the design the snapshot replaced.

    python -m bench.metrics [--quick] [--repeat N] [--json]

History is generated with ``generate_series``: 1,000 connections, finished runs spread over 30
days (1 % failed), each with two tables' results, and one queued run per connection.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

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
    print_json,
    print_table,
    ratio,
    scratch_database,
    settings_for,
)

BASE = [
    "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 100) g",
    "INSERT INTO connections (workspace_id, name, provider) "
    "SELECT 1 + g % 100, 'c' || g, 'simulated' FROM generate_series(1, 1000) g",
]

HISTORY = """
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, attempts,
                             queued_at, started_at, finished_at, results)
SELECT 1 + g %% 1000, 1 + (g %% 1000) %% 100, 'simulated',
       CASE WHEN g %% 100 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       now() - interval '30 days' + g * (interval '30 days' / %(count)s),
       now() - interval '30 days' + g * (interval '30 days' / %(count)s),
       now() - interval '30 days' + g * (interval '30 days' / %(count)s) + interval '5 seconds',
       '{"issues": {"status": "succeeded", "upserted": 10, "unchanged": 200, "tombstoned": 1},
         "projects": {"status": "succeeded", "upserted": 1, "unchanged": 20, "tombstoned": 0}}'
  FROM generate_series(1, %(count)s) g
"""

QUEUED = """
INSERT INTO connection_runs (connection_id, workspace_id, provider, status)
SELECT id, workspace_id, provider, 'queued' FROM connections c
 WHERE NOT EXISTS (SELECT 1 FROM connection_runs r
                    WHERE r.connection_id = c.id AND r.status = 'queued')
"""

# The first design: runs counted by status over all history, records summed over every
# finished run's results.
WHOLE_HISTORY = """
SELECT (SELECT jsonb_agg(x) FROM (SELECT kind, provider, status, count(*)
                                    FROM connection_runs GROUP BY 1, 2, 3) x),
       (SELECT jsonb_agg(y) FROM (
            SELECT r.provider, sum((t.result ->> 'upserted')::bigint),
                   sum((t.result ->> 'unchanged')::bigint),
                   sum((t.result ->> 'tombstoned')::bigint)
              FROM connection_runs r, jsonb_each(r.results) t(name, result)
             WHERE r.finished_at IS NOT NULL GROUP BY 1) y)
"""


def timed(call: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 k finished runs only")
    parser.add_argument("--repeat", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    sizes = [100_000] if args.quick else [100_000, 1_000_000]

    from sync import Engine

    results: list[dict[str, Any]] = []
    with scratch_database("metrics") as url:
        migrate(url)
        machine = machine_info(url)
        with connect(url) as admin, Engine(settings_for(url), pool_size=3) as engine:
            for statement in BASE:
                admin.execute(statement)
            loaded = 0
            for size in sizes:
                admin.execute(HISTORY, {"count": size - loaded})
                loaded = size
                admin.execute(QUEUED)
                admin.execute("VACUUM ANALYZE connection_runs")
                results.append(
                    {
                        "finished_runs": size,
                        "snapshot_ms": timed(
                            lambda: engine.metrics_snapshot(timeout=60), args.repeat
                        ),
                        "whole_history_ms": timed(
                            lambda: admin.execute(WHOLE_HISTORY).fetchone(), args.repeat
                        ),
                        "connections_overview_ms": timed(
                            lambda: engine.connections_overview(), args.repeat
                        ),
                    }
                )
    console.print(machine_line(machine))
    print_table(
        f"/metrics and the connections page as history grows (median of {args.repeat})",
        [
            Column("finished runs"),
            Column("metrics_snapshot ms"),
            Column("whole history ms"),
            Column("whole / snapshot"),
            Column("connections page read (1,000) ms"),
        ],
        [
            (
                f"{r['finished_runs']:,}",
                f"{r['snapshot_ms']:.1f}",
                f"{r['whole_history_ms']:.0f}",
                ratio(r["whole_history_ms"], r["snapshot_ms"]),
                f"{r['connections_overview_ms']:.1f}",
            )
            for r in results
        ],
    )
    print_json("metrics", args, results, machine=machine)


if __name__ == "__main__":
    main()
