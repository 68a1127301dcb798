"""Queue overhead: how many no-op runs per second the queue drains, side by side with the peers
and with the bare claim-then-finish ceiling, all on the same Postgres in one invocation.

    python -m bench.claim [--quick] [--runs N] [--repeat R]

- ours: N pre-enqueued runs of a connector whose one table yields nothing, drained by 1, 2 and
  4 real worker processes calling ``Worker.poll()`` (listen=False) until the queue is empty;
  also 1 process with a zero-table connector (the queue's cost without table bookkeeping);
  then the production loop ``Worker.run()`` (finish-and-claim), with one empty table (1 and 2
  processes) and with zero tables (1 process).
  Each run sits in its own workspace, so the provider limiter never holds a run back.
- ours, application jobs: N jobs of a queue whose handler does nothing, drained by one worker
  process (``Worker.run()``) with 1 lane (one job at a time), 8 and 32 lanes (batched claims).
- ceiling: the bare claim and finish statements on a minimal table, one round trip each,
  autocommit, from one client in a tight loop.
- peers: Procrastinate, PgQueuer (PyPI), graphile-worker 0.17, pg-boss 10 (npm), each in its
  own process, one job at a time, then batched as each documents.

Throughput is jobs / (end of the last job - start of the first). For application jobs and the
peers, those are the wall-clock marks of the first handler call's start and the last one's end,
taken alike in every drain, so none counts the statement that records its last completion; for
connection runs, the first attempt's ``started_at`` and the last one's ``finished_at`` from the
database (that one statement weighs 1/N). Every configuration is repeated R times, round-robin
(so drifting load falls on all alike), and the median is printed with the range. Then the round
trips one run costs are counted from a libpq protocol trace of one worker.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    Column,
    add_json_option,
    as_uri,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    median,
    migrate,
    print_json,
    print_table,
    python,
    ratio,
    run_node,
    scratch_database,
    settings_for,
    spawn,
    spread,
)

SETUP_WORKSPACES = "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, %(n)s) g"
SETUP_CONNECTIONS = """
INSERT INTO connections (workspace_id, name, provider)
SELECT w.id, p.provider || '-' || w.id, p.provider
  FROM workspaces w CROSS JOIN unnest(%(providers)s::text[]) AS p(provider)
"""

# What enqueue_run() inserts, for every connection of a provider at once (setup, not timed).
ENQUEUE_ALL = """
INSERT INTO connection_runs (connection_id, workspace_id, provider, kind, status, trigger)
SELECT id, workspace_id, provider, 'sync', 'queued', 'bench'
  FROM connections WHERE provider = %(provider)s AND status = 'active' ORDER BY id
"""

BARE_TABLE = """
CREATE TABLE public.bare_jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status       text NOT NULL DEFAULT 'queued',
    queued_at    timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    started_at   timestamptz,
    finished_at  timestamptz
);
CREATE INDEX bare_jobs_claimable ON public.bare_jobs (queued_at, id)
    WHERE status IN ('queued', 'running');
"""

# The ceiling, in its two simplest honest forms (one round trip per statement, autocommit).
BARE_FORMS = {
    "SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1, then UPDATE status": (
        "SELECT id FROM public.bare_jobs WHERE status = 'queued' ORDER BY queued_at, id "
        "LIMIT 1 FOR UPDATE SKIP LOCKED",
        "UPDATE public.bare_jobs SET status = 'done', finished_at = now() WHERE id = %s",
    ),
    "claim UPDATE ... (SELECT ... SKIP LOCKED) RETURNING, then finish UPDATE": (
        "UPDATE public.bare_jobs SET status = 'running', attempts = attempts + 1, "
        "started_at = now() WHERE id = (SELECT id FROM public.bare_jobs WHERE status = 'queued' "
        "ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id",
        "UPDATE public.bare_jobs SET status = 'done', finished_at = now() WHERE id = %s",
    ),
}


@dataclass
class Result:
    system: str
    config: str
    processes: int
    rates: list[float] = field(default_factory=list)
    # Application jobs only: each drain's rate between the database's stamps (drain_jobs).
    stamped: list[float] = field(default_factory=list)
    error: str = ""
    ours: bool = False
    ceiling: bool = False

    @property
    def rate(self) -> float:
        return median(self.rates) if self.rates else float("nan")


def vacuum(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


# -- ours ---------------------------------------------------------------------------------


def start_workers(url: str, processes: int, extra: list[str] | None = None) -> list[Any]:
    procs = [
        spawn(
            [python(), "-m", "bench.worker", "--url", url, "--mode", "drain", *(extra or [])],
            stdin=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    for proc in procs:
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"worker did not start: {line!r}")
    return procs


def drain_ours(url: str, provider: str, processes: int, extra: list[str] | None = None) -> float:
    """Enqueue one run per connection of ``provider``, drain them, return runs/s."""
    with connect(url) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM connection_runs").fetchone()
        assert row is not None
        before = row[0]
        n = conn.execute(ENQUEUE_ALL, {"provider": provider}).rowcount
    procs = start_workers(url, processes, extra)
    _go(procs)
    outputs = [json.loads(proc.stdout.readline()) for proc in procs]
    for proc in procs:
        proc.wait(timeout=60)
    executed = sum(o["executed"] for o in outputs)
    if executed != n:
        raise RuntimeError(f"{executed} runs executed, {n} enqueued")
    with connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(a.finished_at) - min(a.started_at)), count(*), "
            "count(*) FILTER (WHERE r.status <> 'succeeded') "
            "FROM run_attempts a JOIN connection_runs r ON r.id = a.run_id WHERE a.run_id > %s",
            (before,),
        ).fetchone()
    assert row is not None
    span, attempts, unsucceeded = float(row[0]), row[1], row[2]
    if attempts != n or unsucceeded:
        raise RuntimeError(f"{attempts} attempts for {n} runs, {unsucceeded} not succeeded")
    return n / span


def _go(procs: list[Any]) -> None:
    """Release the workers together: each waits for a line on stdin."""
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()


# -- ours: application jobs ----------------------------------------------------------------


def drain_jobs(
    result: Result,
    url: str,
    n: int,
    lanes: int,
    batch: int = 0,
    *,
    priorities: bool = False,
    limit: int | None = None,
) -> float:
    """Send ``n`` jobs to the application queue ``bench.noop``, drain them with one worker
    process of ``lanes`` lanes (with ``batch``, each runs a batch handler of that many jobs),
    with ``priorities`` a mix of the ten priorities, with ``limit`` a fleet-wide concurrency
    limit on the queue; return jobs/s from the start of the first handler call to the end of
    the last one: the
    marks the peers' drains take. The span between the database's stamps (the first claim's
    ``started_at`` to the last completion's ``finished_at``) also holds that completion's
    statement; it goes to ``result.stamped``, for comparison with results taken that way."""
    from bench import app_jobs

    with connect(url) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM jobs").fetchone()
        assert row is not None
        before = row[0]
        conn.execute(
            "INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at, "
            "priority) SELECT %(q)s, %(q)s, '{}', 'queued', now(), now(), "
            "CASE WHEN %(mix)s THEN (g * 7) %% 10 END FROM generate_series(1, %(n)s) g",
            {"q": app_jobs.QUEUE, "n": n, "mix": priorities},
        )
    limited = [] if limit is None else ["--global-concurrency", str(limit)]
    proc = spawn(
        [
            *(python(), "-m", "bench.app_jobs", "--url", url),
            *("--lanes", str(lanes), "--jobs", str(n), "--batch", str(batch), *limited),
        ],
        stdin=subprocess.PIPE,
    )
    if proc.stdout.readline().strip() != "READY":  # type: ignore[union-attr]
        raise RuntimeError("the application worker did not start")
    _go([proc])
    out = proc.stdout.readline()  # type: ignore[union-attr]
    proc.wait(timeout=120)
    with connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), count(*) "
            "FROM job_attempts WHERE job_id > %s AND outcome = 'completed'",
            (before,),
        ).fetchone()
    assert row is not None
    if row[1] != n:
        raise RuntimeError(f"{row[1]} jobs completed, {n} sent")
    result.stamped.append(n / float(row[0]))
    return _rate(out, n)


# -- the ceiling --------------------------------------------------------------------------


def drain_bare(url: str, n: int, claim: str, finish: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE public.bare_jobs")
        conn.execute(
            "INSERT INTO public.bare_jobs (status) SELECT 'queued' FROM generate_series(1, %s)",
            (n,),
        )
        conn.execute("VACUUM ANALYZE public.bare_jobs")
        done = 0
        started = time.perf_counter()
        while True:
            row = conn.execute(claim).fetchone()
            if row is None:
                break
            conn.execute(finish, (row[0],))
            done += 1
        elapsed = time.perf_counter() - started
    if done != n:
        raise RuntimeError(f"bare loop finished {done} of {n}")
    return n / elapsed


# -- peers --------------------------------------------------------------------------------


def _peer_cmd(url: str, peer: str, n: int, option: list[str]) -> Callable[[], float]:
    def run() -> float:
        proc = spawn(
            [python(), "-m", "bench.peers", peer, "drain", "--url", url, "--jobs", str(n), *option]
        )
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"{peer} exited with {proc.returncode}")
        return _rate(out, n)

    return run


def _node_cmd(url: str, peer: str, n: int, mode: str) -> Callable[[], float]:
    def run() -> float:
        return _rate(run_node(["drain", peer, as_uri(url), str(n), mode], timeout=600), n)

    return run


def _rate(out: str, n: int) -> float:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"no result in {out[-500:]!r}")
    data = json.loads(lines[-1])
    if data["count"] < n:
        raise RuntimeError(f"only {data['count']} of {n} jobs ran")
    return float(data["count"]) / (data["last"] - data["first"])


# -- round trips --------------------------------------------------------------------------

# libpq prints a query's newlines as they are, so a message may span several lines.
_MESSAGE = re.compile(r"\n(?=[FB]\t\d+\t)")
_PARSE = re.compile(r'^F\t\d+\tParse\t "([^"]*)" "(.*)" \d+', re.DOTALL)
_BIND = re.compile(r'^F\t\d+\tBind\t "[^"]*" "([^"]*)"')
_QUERY = re.compile(r'^F\t\d+\tQuery\t "(.*)"$', re.DOTALL)


def _normal(text: str) -> str:
    text = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    text = re.sub(r"%\(\w+\)s|\$\d+", "$?", text)
    return " ".join(text.split())


def _query_names() -> dict[str, str]:
    from sync.store.queries import QUERIES

    return {_normal(QUERIES._by_name[name].text): name for name in QUERIES.names()}


def round_trips(trace_dir: Path) -> Counter[str]:
    """Round trips per statement in libpq traces: each ReadyForQuery closes one."""
    names = _query_names()
    counts: Counter[str] = Counter()
    for path in trace_dir.glob("*.trace"):
        prepared: dict[str, str] = {}
        current = "?"
        for line in _MESSAGE.split(path.read_text(errors="replace")):
            if m := _PARSE.match(line):
                text = _normal(m.group(2))
                label = names.get(text, text[:60])
                if m.group(1):
                    prepared[m.group(1)] = label
                    current = f"(prepare) {label}"
                else:
                    current = label
            elif (m := _BIND.match(line)) and m.group(1):
                current = prepared.get(m.group(1), "?")
            elif m := _QUERY.match(line):
                text = _normal(m.group(1))
                current = names.get(text, text[:60])
            elif "\tReadyForQuery\t" in line:
                counts[current] += 1
    return counts


def count_round_trips(
    url: str, provider: str, runs: int, extra: list[str] | None = None
) -> tuple[int, Counter[str]]:
    with connect(url) as conn:
        conn.execute(
            "UPDATE connections SET status = 'paused' WHERE provider = %s AND id NOT IN "
            "(SELECT id FROM connections WHERE provider = %s ORDER BY id LIMIT %s)",
            (provider, provider, runs),
        )
        n = conn.execute(ENQUEUE_ALL, {"provider": provider}).rowcount
    trace_dir = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    try:
        procs = start_workers(url, 1, ["--trace", str(trace_dir), *(extra or [])])
        _go(procs)
        procs[0].stdout.readline()
        procs[0].wait(timeout=60)
        return n, round_trips(trace_dir)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
        with connect(url) as conn:
            conn.execute(
                "UPDATE connections SET status = 'active' WHERE provider = %s", (provider,)
            )


# -- main ---------------------------------------------------------------------------------


Task = tuple[Result, Callable[[], float]]


def measure_all(tasks: list[Task], repeat: int, url: str) -> None:
    """Round-robin: every contender's k-th drain runs before anyone's (k+1)-th, so the load
    other programs put on a shared machine falls on all of them alike."""
    for round_ in range(repeat):
        console.print(f"round {round_ + 1} of {repeat}")
        for result, fn in tasks:
            if result.error:
                continue
            vacuum(url)
            try:
                result.rates.append(fn())
            except Exception as exc:
                result.error = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                console.print(f"[red]{result.system} {result.config}: {result.error}[/red]")
                continue
            stamped = f" ({result.stamped[-1]:,.0f}/s by database stamps)" if result.stamped else ""
            console.print(
                f"  {result.system:18} {result.config[:50]:50} {result.processes} proc: "
                f"{result.rates[-1]:8,.0f}/s{stamped}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small N, one repetition")
    parser.add_argument("--runs", type=int, help="runs/jobs per drain (default 2000)")
    parser.add_argument("--repeat", type=int, help="repetitions of each drain (default 3)")
    parser.add_argument("--no-peers", action="store_true")
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    n = args.runs or (300 if args.quick else 2000)
    repeat = args.repeat or (1 if args.quick else 3)

    with scratch_database("claim") as url:
        console.print(f"[bold]bench.claim[/bold]: {n} no-op jobs per drain, {repeat} repeats")
        machine = machine_info(url)
        console.print(machine_line(machine))
        migrate(url)
        from bench import app_jobs
        from sync import Engine

        with Engine(settings_for(url), pool_size=3) as engine:
            app_jobs.declare(engine.queues)
        with connect(url) as conn:
            conn.execute(SETUP_WORKSPACES, {"n": n})
            conn.execute(
                SETUP_CONNECTIONS, {"n": n, "providers": ["bench_noop", "bench_no_tables"]}
            )
            conn.execute(BARE_TABLE)
        tasks: list[Task] = [
            (
                Result("connector-sync", "1 empty table per run", p, ours=True),
                lambda p=p: drain_ours(url, "bench_noop", p),  # type: ignore[misc]
            )
            for p in (1, 2, 4)
        ]
        tasks.append(
            (
                Result("connector-sync", "zero tables per run", 1, ours=True),
                lambda: drain_ours(url, "bench_no_tables", 1),
            )
        )
        # The production loop (Worker.run(), listen=False), which may do what a bare poll()
        # may not, such as finishing one run and claiming the next in one round trip.
        tasks.extend(
            (
                Result("connector-sync", "Worker.run() loop, 1 empty table", p, ours=True),
                lambda p=p: drain_ours(url, "bench_noop", p, ["--loop"]),  # type: ignore[misc]
            )
            for p in (1, 2)
        )
        # The queue's own cost in the production loop, a job that does nothing, as the peers'.
        tasks.append(
            (
                Result("connector-sync", "Worker.run() loop, zero tables", 1, ours=True),
                lambda: drain_ours(url, "bench_no_tables", 1, ["--loop"]),
            )
        )
        # Application jobs (a queue's no-op handler) in lanes of one worker process: one lane
        # claims one job at a time; more lanes on a standard queue claim in batches.
        for lanes in (1, 8, 32):
            config = "1 lane: one at a time" if lanes == 1 else f"{lanes} lanes: batched claims"
            jobs = Result("connector-sync jobs", config, 1)
            tasks.append((jobs, partial(drain_jobs, jobs, url, n, lanes)))
        # A batch handler, as pg-boss's batchSize: one claim, one call and one completion
        # statement for up to 100 jobs; one lane, as pg-boss's one fetch() loop.
        batched = Result("connector-sync jobs", "batch handler of 100, 1 lane", 1)
        tasks.append((batched, partial(drain_jobs, batched, url, n, 1, batch=100)))
        # Priorities: the ten of them mixed, claimed in priority order by 8 batching lanes.
        mixed = Result("connector-sync jobs", "8 lanes, priorities 0-9 mixed", 1)
        tasks.append((mixed, partial(drain_jobs, mixed, url, n, 8, priorities=True)))
        # A fleet-wide limit of 4 at once: every claim of the queue takes its turn on the
        # queue's row and counts its active jobs; 8 lanes, so half of them wait for room.
        limited = Result("connector-sync jobs", "8 lanes, global concurrency 4", 1)
        tasks.append((limited, partial(drain_jobs, limited, url, n, 8, limit=4)))
        for form, (claim_sql, finish_sql) in BARE_FORMS.items():
            tasks.append(
                (
                    Result("ceiling (bare SQL)", form, 1, ceiling=True),
                    lambda c=claim_sql, f=finish_sql: drain_bare(url, n, c, f),  # type: ignore[misc]
                )
            )
        if not args.no_peers:
            tasks.extend(peer_tasks(url, n))
        measure_all(tasks, repeat, url)
        results = [result for result, _ in tasks]

        trace_runs = min(n, 200)
        traced, trips = count_round_trips(url, "bench_noop", trace_runs)
        traced0, trips0 = count_round_trips(url, "bench_no_tables", trace_runs)
        traced1, trips1 = count_round_trips(url, "bench_noop", trace_runs, ["--loop"])
        traced2, trips2 = count_round_trips(url, "bench_no_tables", trace_runs, ["--loop"])

    report(results, n, repeat)
    traces = {
        "1 empty table": (traced, trips),
        "zero tables": (traced0, trips0),
        "1 empty table, run() loop": (traced1, trips1),
        "zero tables, run() loop": (traced2, trips2),
    }
    report_round_trips(traces)
    print_json(
        "claim",
        args,
        [
            {
                "system": r.system,
                "configuration": r.config,
                "processes": r.processes,
                "jobs_per_s": r.rate,
                "jobs_per_s_each_repeat": r.rates,
                "jobs_per_s_by_database_stamps": median(r.stamped) if r.stamped else None,
                "error": r.error or None,
            }
            for r in results
        ],
        machine=machine,
        round_trips_per_run={
            name: {"runs": runs, "by_statement": {k: v / runs for k, v in counts.items()}}
            for name, (runs, counts) in traces.items()
        },
    )


def peer_tasks(url: str, n: int) -> list[Task]:
    tasks: list[Task] = []
    peers: list[tuple[str, str, Callable[[], Any] | None, Callable[[], float]]] = [
        (
            "procrastinate",
            "concurrency 1",
            lambda: _setup_python_peer(url, "procrastinate"),
            _peer_cmd(url, "procrastinate", n, ["--concurrency", "1"]),
        ),
        (
            "procrastinate",
            "concurrency 10 (it has no batch fetch)",
            None,
            _peer_cmd(url, "procrastinate", n, ["--concurrency", "10"]),
        ),
        (
            "pgqueuer",
            "batch_size 1",
            lambda: _setup_python_peer(url, "pgqueuer"),
            _peer_cmd(url, "pgqueuer", n, ["--batch", "1"]),
        ),
        (
            "pgqueuer",
            "batch_size 10 (its default)",
            None,
            _peer_cmd(url, "pgqueuer", n, ["--batch", "10"]),
        ),
        (
            "graphile-worker",
            "concurrency 1",
            lambda: run_node(["setup", "graphile", as_uri(url)], timeout=120),
            _node_cmd(url, "graphile", n, "single"),
        ),
        (
            "graphile-worker",
            "localQueue 100, completeJobBatchDelay 0",
            None,
            _node_cmd(url, "graphile", n, "batch"),
        ),
        (
            "pg-boss",
            "fetch() + complete(), 1 job",
            lambda: run_node(["setup", "pgboss", as_uri(url)], timeout=120),
            _node_cmd(url, "pgboss", n, "single"),
        ),
        (
            "pg-boss",
            "fetch() + complete(), batchSize 100",
            None,
            _node_cmd(url, "pgboss", n, "batch"),
        ),
        (
            "pg-boss",
            "work(), batchSize 100, poll 0.5 s (its minimum)",
            None,
            _node_cmd(url, "pgboss", n, "work"),
        ),
    ]
    broken: set[str] = set()
    for system, config, setup, fn in peers:
        result = Result(system, config, 1)
        if system in broken:
            result.error = "setup failed"
        elif setup is not None:
            try:
                setup()
            except Exception as exc:
                broken.add(system)
                result.error = f"setup failed: {exc}"[:120]
                console.print(f"[red]{system}: setup failed: {exc}[/red]")
        tasks.append((result, fn))
    return tasks


def _setup_python_peer(url: str, peer: str) -> None:
    proc = spawn([python(), "-m", "bench.peers", peer, "setup", "--url", url])
    proc.communicate(timeout=120)
    if proc.returncode:
        raise RuntimeError(f"{peer} setup exited with {proc.returncode}")


def report(results: list[Result], n: int, repeat: int) -> None:
    ours = next(r.rate for r in results if r.ours and r.processes == 1)
    ceiling = max((r.rate for r in results if r.ceiling and r.rates), default=float("nan"))
    rows = []
    for r in results:
        if r.error and not r.rates:
            rows.append([r.system, r.config, r.processes, "error", r.error, "", "", ""])
            continue
        per_run_ms = 1000 * r.processes / r.rate
        rows.append(
            [
                r.system,
                r.config,
                r.processes,
                f"{r.rate:,.0f}",
                spread(r.rates),
                f"{per_run_ms:.2f}",
                ratio(r.rate, ours),
                ratio(r.rate, ceiling),
            ]
        )
    print_table(
        f"No-op jobs drained: {n} per drain, median of {repeat}",
        [
            Column("system", "left"),
            Column("configuration", "left"),
            "procs",
            "jobs/s",
            "range",
            "ms/job/proc",
            "x ours (1 proc)",
            "x ceiling",
        ],
        rows,
    )


def report_round_trips(traces: dict[str, tuple[int, Counter[str]]]) -> None:
    labels: list[str] = []
    for _, counts in traces.values():
        for label, _count in counts.most_common():
            if label not in labels:
                labels.append(label)
    rows = []
    totals = dict.fromkeys(traces, 0.0)
    for label in labels:
        row: list[Any] = [label]
        significant = False
        for name, (runs, counts) in traces.items():
            per_run = counts.get(label, 0) / runs
            significant = significant or per_run >= 0.5
            totals[name] += per_run
            row.append(f"{per_run:.2f}")
        if significant:
            rows.append(row)
    rows.append(["(everything else: startup, prepares, idle polls)"])
    for name, (runs, counts) in traces.items():
        shown = sum(counts[lbl] / runs for lbl in labels if _shown(lbl, traces))
        rows[-1].append(f"{totals[name] - shown:.2f}")
    rows.append(["total round trips per run", *(f"{t:.2f}" for t in totals.values())])
    print_table(
        "Round trips per no-op run (libpq trace of one worker process)",
        [Column("statement", "left"), *(f"{k} ({v[0]} runs)" for k, v in traces.items())],
        rows,
    )


def _shown(label: str, traces: dict[str, tuple[int, Counter[str]]]) -> bool:
    return any(counts.get(label, 0) / runs >= 0.5 for runs, counts in traces.values())


if __name__ == "__main__":
    main()
