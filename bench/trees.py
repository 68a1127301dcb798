"""The before and after of a change: bench.claim's application-job drains, run by two or more
checkouts of this repository in turn, drain by drain, so that a machine whose speed drifts
within minutes weighs on each alike (two runs of bench.claim one after the other do not).

    python -m bench.trees BEFORE_CHECKOUT AFTER_CHECKOUT [--runs N] [--repeat R]

Each checkout drains a scratch database of its own, migrated by its own code, with its own
``bench/app_jobs.py`` worker (one that sets ``Marks.target``, so that its harness costs what
this one's does). Each round drains every configuration once per checkout; the table shows each
checkout's median and range, and the last checkout's median against the first's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from pathlib import Path

from bench.claim import _rate
from bench.common import (
    Column,
    connect,
    console,
    median,
    print_table,
    python,
    ratio,
    scratch_database,
    spread,
)

# (configuration, lanes, batch handler size or 0): the application rows of bench.claim.
CONFIGURATIONS = [
    ("1 lane: one at a time", 1, 0),
    ("8 lanes: batched claims", 8, 0),
    ("32 lanes: batched claims", 32, 0),
    ("batch handler of 100, 1 lane", 1, 100),
]

# Run by each checkout's own code: its schema, and the benchmark's queue declared.
SETUP = """
import sys
from bench import app_jobs
from bench.common import migrate, settings_for
from sync import Engine

migrate(sys.argv[1])
with Engine(settings_for(sys.argv[1]), pool_size=3) as engine:
    app_jobs.declare(engine.queues)
"""

# The columns every release's jobs table has: the jobs each checkout drains.
SEND = (
    "INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at) "
    "SELECT 'bench.noop', 'bench.noop', '{}', 'queued', now(), now() "
    "FROM generate_series(1, %(n)s)"
)


def _env(checkout: Path) -> dict[str, str]:
    """A child's environment that imports ``checkout``'s code and no other's."""
    return {**os.environ, "PYTHONPATH": str(checkout)}


def drain(checkout: Path, url: str, n: int, lanes: int, batch: int) -> float:
    """Send ``n`` jobs and drain them with one worker process of ``checkout``; jobs/s from the
    start of its first handler call to the end of its last."""
    with connect(url) as conn:
        conn.execute(SEND, {"n": n})
    args = ["--url", url, "--lanes", str(lanes), "--jobs", str(n), "--batch", str(batch)]
    proc = subprocess.Popen(
        [python(), "-m", "bench.app_jobs", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(checkout),
        cwd=checkout,
    )
    assert proc.stdin is not None and proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        raise RuntimeError(f"the worker of {checkout} did not start")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out = proc.stdout.readline()
    proc.wait(timeout=120)
    return _rate(out, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path, help="two or more checkouts")
    parser.add_argument("--runs", type=int, default=2000, help="jobs per drain")
    parser.add_argument("--repeat", type=int, default=7, help="rounds of drains")
    args = parser.parse_args()
    checkouts: list[Path] = [c.resolve() for c in args.checkouts]
    rates: dict[tuple[str, Path], list[float]] = {}
    with contextlib.ExitStack() as stack:
        urls = {}
        for number, checkout in enumerate(checkouts):
            url = stack.enter_context(scratch_database(f"trees{number}"))
            setup = [python(), "-c", SETUP, url]
            subprocess.run(setup, check=True, env=_env(checkout), cwd=checkout)
            urls[checkout] = url
        # A first round unmeasured: each database's first drains pay for cold caches.
        for round_ in range(args.repeat + 1):
            console.print(f"round {round_} of {args.repeat}")
            for name, lanes, batch in CONFIGURATIONS:
                for checkout in checkouts:
                    rate = drain(checkout, urls[checkout], args.runs, lanes, batch)
                    if round_:
                        rates.setdefault((name, checkout), []).append(rate)
    columns: list[str | Column] = [Column("configuration", "left")]
    columns += [f"{c.name} jobs/s (range)" for c in checkouts]
    columns.append(f"{checkouts[-1].name} / {checkouts[0].name}")
    rows = []
    for name, _, _ in CONFIGURATIONS:
        found = [rates[(name, c)] for c in checkouts]
        cells = [f"{median(r):,.0f} ({spread(r)})" if len(r) > 1 else f"{r[0]:,.0f}" for r in found]
        rows.append([name, *cells, ratio(median(found[-1]), median(found[0]))])
    print_table(
        f"application jobs, {args.runs} a drain, median of {args.repeat} rounds", columns, rows
    )


if __name__ == "__main__":
    main()
