"""A worker process that runs application jobs for the benchmarks:
``python -m bench.app_jobs --url URL --mode drain|serve --lanes N``.

Its application (``setup``) declares the standard queue ``bench.noop``, whose handler does
nothing (with ``--batch N``, a batch handler of N jobs at a time, as pg-boss's ``batchSize``:
``setup_batch``; with ``--global-concurrency N``, at most N of its jobs run at once, fleet-wide).
``drain``: prints ``READY``, waits for a line on stdin, runs ``Worker.run()`` (no LISTEN) with
``N`` lanes of the queue until ``--jobs`` jobs have completed, and prints one JSON
line: the count, the wall-clock start of the first handler call and the end of the last one, the
marks bench/peers.py and bench/node/peers.mjs take of the peers' handlers. ``serve``:
``Worker.run()`` with LISTEN/NOTIFY until SIGTERM, for bench/latency.py: its handler prints
``START <time>`` as each job starts."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

from bench.common import Marks, settings_for
from sync.queues import Abort, Job, Queues, queue_spec

QUEUE = "bench.noop"
_record_starts = False
_queues: Queues | None = None
# --global-concurrency: the queue's fleet-wide limit (None: none), declared at the worker's start.
_global_concurrency: int | None = None


_marks = Marks()


def declare(queues: Queues) -> None:
    queues.declare_queue(queue_spec(QUEUE, global_concurrency=_global_concurrency))


def handle(job: Job, abort: Abort) -> None:
    if _record_starts:
        print(f"START {time.time()}", flush=True)
    _marks.started()
    _marks.ended()


def handle_batch(jobs: list[Job], abort: Abort) -> None:
    _marks.started()
    _marks.ended(len(jobs))


def setup(queues: Queues) -> None:
    global _queues
    _queues = queues
    declare(queues)
    queues.register(QUEUE, handle)


def setup_batch(queues: Queues) -> None:
    declare(queues)
    queues.register_batch(QUEUE, handle_batch, size=_batch_size())


def _batch_size() -> int:
    return int(os.environ.get("BENCH_BATCH_SIZE", "100"))


def main() -> None:
    # The worker loads this module by name (--app bench.app_jobs:setup), a module apart from
    # the one `python -m` runs as __main__: count on that one's marks.
    from bench import app_jobs

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=["drain", "serve"], default="drain")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--poll-interval", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=0, help="a batch handler of this size")
    parser.add_argument("--global-concurrency", type=int, help="the queue's fleet-wide limit")
    args = parser.parse_args()
    app_jobs._global_concurrency = args.global_concurrency
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    from sync import Engine

    settings = settings_for(
        args.url, poll_interval=args.poll_interval, lanes=f"{QUEUE}={args.lanes}"
    )
    with Engine(settings, pool_size=max(4, min(args.lanes + 2, 10))) as engine:
        if args.mode == "serve":
            app_jobs._record_starts = True
            worker = engine.worker(apps=["bench.app_jobs:setup"])
            print("READY", flush=True)
            worker.run()
            return
        app = "bench.app_jobs:setup"
        if args.batch:
            os.environ["BENCH_BATCH_SIZE"] = str(args.batch)
            app = "bench.app_jobs:setup_batch"
        worker = engine.worker(listen=False, apps=[app])
        app_jobs._marks.target = args.jobs
        print("READY", flush=True)
        sys.stdin.readline()
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        app_jobs._marks.done.wait()
        worker.stop()
        thread.join(timeout=60)
    app_jobs._marks.report()


if __name__ == "__main__":
    main()
