"""The Python peers, each run in its own process like our worker:
``python -m bench.peers procrastinate|pgqueuer drain|serve --url URL ...``.

``drain``: enqueue ``--jobs`` no-op jobs in bulk (not timed), then work them until the queue is
empty and print one JSON line with the first job's start and the last job's end (wall clock).
``serve``: print ``READY`` and work forever, printing ``START <time>`` when each job starts
(bench/latency.py enqueues and reads those lines).

Peers are installed from PyPI into the benchmark's environment (``pip install -e '.[bench]'``);
nothing of theirs is vendored here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg

from bench.common import Marks, as_uri


def _start_mark() -> None:
    print(f"START {time.time():.6f}", flush=True)


# -- procrastinate ------------------------------------------------------------------------


def _procrastinate_app(url: str) -> Any:
    import procrastinate

    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


async def procrastinate_setup(url: str) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_main(args: argparse.Namespace) -> None:
    app = _procrastinate_app(args.url)
    marks = Marks()

    @app.task(name="noop", queue="bench")
    async def noop(seq: int) -> None:
        if args.action == "serve":
            _start_mark()
            return
        marks.started()
        marks.ended()

    async with app.open_async():
        if args.action == "serve":
            print("READY", flush=True)
            await app.run_worker_async(
                queues=["bench"],
                concurrency=1,
                install_signal_handlers=True,
                fetch_job_polling_interval=args.poll_interval,
            )
            return
        for start in range(0, args.jobs, 1000):
            await noop.batch_defer_async(
                *({"seq": i} for i in range(start, min(start + 1000, args.jobs)))
            )
        await app.run_worker_async(
            queues=["bench"],
            concurrency=args.concurrency,
            wait=False,
            install_signal_handlers=False,
        )
    marks.report()


# -- pgqueuer -----------------------------------------------------------------------------


async def _asyncpg(url: str) -> Any:
    """PgQueuer's primary driver is asyncpg (its psycopg driver lets a LISTEN wait of up to a
    second hold the connection that dequeues)."""
    import asyncpg

    return await asyncpg.connect(as_uri(url))


async def pgqueuer_setup(url: str) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    conn = await _asyncpg(url)
    await Queries(AsyncpgDriver(conn)).install()
    await conn.close()


async def pgqueuer_main(args: argparse.Namespace) -> None:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn = await _asyncpg(args.url)
    driver = AsyncpgDriver(conn)
    marks = Marks()
    qm = QueueManager(Queries(driver))

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        if args.action == "serve":
            _start_mark()
            return
        marks.started()
        marks.ended()

    if args.action == "serve":
        print("READY", flush=True)
        await qm.run(batch_size=1, dequeue_timeout=timedelta(seconds=args.poll_interval))
        return
    queries = Queries(driver)
    for start in range(0, args.jobs, 1000):
        size = min(1000, args.jobs - start)
        await queries.enqueue(["noop"] * size, [None] * size, [0] * size)
    await qm.run(
        batch_size=args.batch,
        mode=QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
    )
    await conn.close()
    marks.report()


# -- the bare LISTEN/NOTIFY ceiling -------------------------------------------------------

BARE_CHANNEL = "bench_bare"


def bare_serve(url: str) -> None:
    """LISTEN and print the time each notification arrives: the wake-up no queue can beat."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {BARE_CHANNEL}")
        print("READY", flush=True)
        for _ in conn.notifies():
            _start_mark()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["procrastinate", "pgqueuer", "bare"])
    parser.add_argument("action", choices=["setup", "drain", "serve"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.peer == "bare":
        bare_serve(args.url)
        return
    if args.action == "setup":
        setup = procrastinate_setup if args.peer == "procrastinate" else pgqueuer_setup
        asyncio.run(setup(args.url))
        return
    runner = procrastinate_main if args.peer == "procrastinate" else pgqueuer_main
    asyncio.run(runner(args))


if __name__ == "__main__":
    main()
