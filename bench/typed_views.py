"""Readers' queries through a connection's typed view, against the same rows in a real typed
table filled by ``COPY``: a filter, an aggregate and a lookup by key, over N rows (1 M).

    python -m bench.typed_views [--n N] [--repeat R] [--json]

The view's types come from a real sync of the first ``--sync-n`` rows (in this process, through
a worker's ``poll()``); the other rows are added to ``records`` with the same shape by one
``INSERT ... SELECT`` (a sync of 1 M rows is what ``bench.records`` measures). The typed table
is filled with ``COPY`` from the view and has a primary key on ``_key``, as ``records`` has on
the key. Both are analyzed and vacuumed, then each query runs ``--repeat`` times, warm, and the
median is reported.

Also measured: what typing costs a sync, the observation of every record (``Shape.observe``)
beside the encoding the record writer does anyway (``encode``), on the same records; and a first
sync of ``--sync-n`` records in this process with the typed views and without them (their calls
made no-ops), interleaved ``--sync-rounds`` times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import (
    add_json_option,
    console,
    json_mode,
    machine_info,
    migrate,
    print_json,
    print_table,
    ratio,
    scratch_database,
    settings_for,
)
from connectors import Connector, Mode, Table, register
from sync import Engine

STATES = ("open", "in_progress", "review", "closed")
PEOPLE = ("ada", "grace", "linus", "barbara", "ken", "margaret")
START = datetime(2024, 1, 1, tzinfo=UTC)

QUERIES = {
    "filter": "SELECT count(*) FROM {t} WHERE state = 'review' AND amount > 90000",
    "aggregate": "SELECT state, count(*), sum(amount), avg(score) FROM {t} GROUP BY state",
    "lookup by key": "SELECT * FROM {t} WHERE _key = '123457'",
}


def issue(i: int) -> dict[str, Any]:
    rng = random.Random(i)
    return {
        "id": i,
        "title": f"Issue {i}",
        "state": rng.choice(STATES),
        "assignee": rng.choice(PEOPLE),
        "amount": rng.randrange(0, 100_000),
        "score": round(rng.random() * 10, 3),
        "closed": rng.random() < 0.25,
        "created_at": (START + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
        "due": (START + timedelta(days=i % 365)).date().isoformat(),
        "labels": rng.sample(["bug", "ui", "api", "docs"], 2),
    }


_SYNC_N = 2000


@register
class TypedIssues(Connector):
    provider = "bench_typed_issues"
    tables = (Table("issues", "id", Mode.FULL),)

    def read(self, table: Table) -> Iterator[Any]:
        for start in range(0, _SYNC_N, 1000):
            yield [issue(i) for i in range(start, min(start + 1000, _SYNC_N))]


# The rest of the rows, the same shape as issue() (not the same random values), in SQL.
FILL = """
INSERT INTO records (connection_id, table_name, external_id, data, content_hash, written_by)
SELECT %(connection_id)s, 'issues', i::text,
       jsonb_build_object(
           'id', i, 'title', 'Issue ' || i,
           'state', (ARRAY['open','in_progress','review','closed'])[1 + i %% 4],
           'assignee', (ARRAY['ada','grace','linus','barbara','ken','margaret'])[1 + i %% 6],
           'amount', (i::bigint * 7919) %% 100000, 'score', round(((i * 31) %% 10000) / 1000.0, 3),
           'closed', i %% 4 = 3,
           'created_at', to_char((timestamptz '2024-01-01Z' + i * interval '1 minute')
                                 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           'due', to_char(date '2024-01-01' + i %% 365, 'YYYY-MM-DD'),
           'labels', jsonb_build_array('bug', 'api')),
       '\\x00'::bytea, gen_random_uuid()
  FROM generate_series(%(start)s, %(end)s - 1) AS i
"""


def timed(conn: psycopg.Connection[Any], query: sql.Composable, repeat: int) -> list[float]:
    conn.execute(query).fetchall()  # warm
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        conn.execute(query).fetchall()
        times.append((time.perf_counter() - began) * 1000)
    return times


def typing_cost(n: int) -> dict[str, float]:
    """Microseconds per record: observing it for the typed views, and encoding it."""
    from sync.runs.records import encode
    from sync.typed.evolve import Shape

    records = [issue(i) for i in range(n)]
    shape = Shape()
    began = time.perf_counter()
    for record in records:
        shape.observe(record)
    observe = time.perf_counter() - began
    began = time.perf_counter()
    for record in records:
        encode(record, "issues", str(record["id"]))
    encoding = time.perf_counter() - began
    return {"observe_us": observe / n * 1e6, "encode_us": encoding / n * 1e6}


@register
class GeneratedIssues(Connector):
    """``_GENERATED`` issues, for a sync's throughput with and without the typed views."""

    provider = "bench_typed_generated"
    tables = (Table("issues", "id", Mode.FULL),)

    def read(self, table: Table) -> Iterator[Any]:
        for start in range(0, _GENERATED[0], 1000):
            yield [issue(i) for i in range(start, min(start + 1000, _GENERATED[0]))]


_GENERATED = [0]


def sync_cost(n: int, rounds: int) -> dict[str, float]:
    """Records per second of a first sync of ``n`` records in this process (a worker's
    ``poll()``), with the typed views and with their three calls made no-ops, interleaved
    ``rounds`` times; the medians."""
    from sync.runs import typed

    _GENERATED[0] = n
    real = (typed.TableViews.observe, typed.TableViews.before_write, typed.TableViews.finish)
    off = (lambda self, record: None, lambda self: None, lambda self: None)
    rates: dict[str, list[float]] = {"with": [], "without": []}
    with scratch_database("typed_sync") as url:
        migrate(url)
        with Engine(settings_for(url), pool_size=4) as engine:
            for i in range(rounds * 2):
                label = "with" if i % 2 == 0 else "without"
                (
                    typed.TableViews.observe,  # type: ignore[method-assign]
                    typed.TableViews.before_write,  # type: ignore[method-assign]
                    typed.TableViews.finish,  # type: ignore[method-assign]
                ) = real if label == "with" else off  # type: ignore[assignment]
                ws = engine.create_workspace(f"w{i}")
                conn = engine.create_connection(ws.id, "c", GeneratedIssues.provider)
                began = time.perf_counter()
                queued = engine.sync(conn.id)
                assert engine.worker(listen=False).poll()
                took = time.perf_counter() - began
                assert engine.run(queued.id).status == "succeeded"
                rates[label].append(n / took)
    (typed.TableViews.observe, typed.TableViews.before_write, typed.TableViews.finish) = real  # type: ignore[method-assign]
    return {
        "with_per_s": statistics.median(rates["with"]),
        "without_per_s": statistics.median(rates["without"]),
    }


def run(n: int, repeat: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with scratch_database("typed") as url:
        migrate(url)
        with Engine(settings_for(url), pool_size=3) as engine:
            ws = engine.create_workspace("bench")
            conn = engine.create_connection(ws.id, "issues", TypedIssues.provider)
            run_ = engine.sync(conn.id)
            assert engine.worker(listen=False).poll()
            assert engine.run(run_.id).status == "succeeded"
            shown = engine.reader_schema(conn.id, "issues")
            schema, view = shown.schema or "", shown.tables[0].view
            columns = {c.name: c.type for c in shown.tables[0].columns}
        with psycopg.connect(url, autocommit=True, options="-c search_path=sync") as db:
            console.print(f"filling records to {n:,} rows", style="dim")
            db.execute(FILL, {"connection_id": conn.id, "start": _SYNC_N, "end": n})
            typed = sql.Identifier("public", "issues_typed")
            defs = ", ".join(f'"{name}" {kind}' for name, kind in columns.items())
            db.execute(
                sql.SQL(
                    "CREATE TABLE {} (_key text PRIMARY KEY, _synced_at timestamptz, "
                    "_first_seen_at timestamptz, " + defs + ")"  # type: ignore[operator]
                ).format(typed)
            )
            source = sql.Identifier(schema, view)
            console.print("copying the view into a typed table with COPY", style="dim")
            began = time.perf_counter()
            # Out of the view on one connection, into the table on another.
            with (
                psycopg.connect(url, autocommit=True) as other,
                db.cursor() as out,
                other.cursor() as into,
                out.copy(sql.SQL("COPY (SELECT * FROM {}) TO STDOUT").format(source)) as reading,
                into.copy(sql.SQL("COPY {} FROM STDIN").format(typed)) as writing,
            ):
                for block in reading:
                    writing.write(block)
            copy_seconds = time.perf_counter() - began
            db.execute("VACUUM ANALYZE sync.records")
            db.execute(sql.SQL("VACUUM ANALYZE {}").format(typed))
            # The same view without the security barrier, to show what the barrier costs.
            plain = sql.Identifier("public", "issues_plain")
            definition = db.execute(
                "SELECT pg_get_viewdef(format('%%I.%%I', %s::text, %s::text)::regclass)",
                (schema, view),
            ).fetchone()
            assert definition is not None
            db.execute(
                sql.SQL("CREATE VIEW {} AS ").format(plain) + sql.SQL(definition[0])  # type: ignore[arg-type]
            )
            rows = []
            for name, template in QUERIES.items():
                v, p, t = (
                    statistics.median(timed(db, sql.SQL(template).format(t=on), repeat))
                    for on in (source, plain, typed)
                )
                rows.append(
                    {
                        "query": name,
                        "sql": template,
                        "view_ms": v,
                        "plain_view_ms": p,
                        "table_ms": t,
                        "ratio": v / t,
                    }
                )
            sizes = db.execute(
                sql.SQL(
                    "SELECT pg_total_relation_size('sync.records'), pg_total_relation_size({})"
                ).format(sql.Literal("public.issues_typed"))
            ).fetchone()
            machine = machine_info(url)
    extra = {
        "copy_seconds": copy_seconds,
        "records_bytes": sizes[0] if sizes else None,
        "typed_table_bytes": sizes[1] if sizes else None,
        "machine": machine,
    }
    return rows, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--typing-n", type=int, default=100_000)
    parser.add_argument("--sync-n", type=int, default=100_000)
    parser.add_argument("--sync-rounds", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    rows, extra = run(args.n, args.repeat)
    print_table(
        f"readers' queries over {args.n:,} rows: median of {args.repeat} warm runs (ms)",
        ["query", "typed view", "same, no barrier", "typed table (COPY)", "view / table"],
        [
            [
                r["query"],
                f"{r['view_ms']:,.1f}",
                f"{r['plain_view_ms']:,.1f}",
                f"{r['table_ms']:,.1f}",
                ratio(r["view_ms"], r["table_ms"]),
            ]
            for r in rows
        ],
    )
    cost = typing_cost(args.typing_n)
    cost.update(sync_cost(args.sync_n, args.sync_rounds))
    print_table(
        f"a first sync of {args.sync_n:,} records in one process: median of "
        f"{args.sync_rounds}, interleaved (records/s)",
        ["with typed views", "without (their calls made no-ops)", "with / without"],
        [
            [
                f"{cost['with_per_s']:,.0f}",
                f"{cost['without_per_s']:,.0f}",
                ratio(cost["with_per_s"], cost["without_per_s"]),
            ]
        ],
    )
    print_table(
        f"what typing costs a sync, per record ({args.typing_n:,} records, µs)",
        ["observe (typed views)", "encode (the writer's own)", "observe / encode"],
        [
            [
                f"{cost['observe_us']:.2f}",
                f"{cost['encode_us']:.2f}",
                ratio(cost["observe_us"], cost["encode_us"]),
            ]
        ],
    )
    console.print(
        f"COPY of the view into the table: {extra['copy_seconds']:.1f} s; records "
        f"{(extra['records_bytes'] or 0) / 1e6:,.0f} MB, typed table "
        f"{(extra['typed_table_bytes'] or 0) / 1e6:,.0f} MB",
        style="dim",
    )
    print_json(
        "typed_views",
        args,
        rows,
        machine=extra.pop("machine"),
        typing=cost,
        **extra,
    )


if __name__ == "__main__":
    main()
