"""A real connector-sync worker process for the benchmarks:
``python -m bench.worker --url URL --mode drain|serve``.

``drain``: prints ``READY``, waits for a line on stdin (so several processes start together),
then calls ``Worker.poll()`` until the queue is empty (or, with ``--loop``, runs the production
loop ``Worker.run()`` until no run finishes for half a second) and prints one JSON line: runs
executed, wall-clock span, peak RSS. ``serve``: the normal ``Worker.run()`` loop
(LISTEN/NOTIFY unless ``--no-listen``) until SIGTERM.

``--trace DIR`` turns on libpq's protocol trace for every connection the worker opens, so
bench/claim.py can count the round trips a run costs (each ReadyForQuery ends one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import bench.connectors  # noqa: F401 - registers the bench connectors
from bench.common import settings_for


def _install_tracing(directory: Path) -> None:
    """Make the engine's pool open connections that write a libpq trace, one file each."""
    import psycopg
    from psycopg import pq

    import sync.store.db

    directory.mkdir(parents=True, exist_ok=True)
    files: list[Any] = []

    class TracedConnection(psycopg.Connection):  # type: ignore[type-arg]
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            conn = super().connect(*args, **kwargs)
            handle = open(directory / f"{os.getpid()}-{len(files)}.trace", "w")  # noqa: SIM115
            files.append(handle)
            conn.pgconn.trace(handle.fileno())
            conn.pgconn.set_trace_flags(
                pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE  # type: ignore[attr-defined]
            )
            return conn

    sync.store.db.Connection = TracedConnection  # type: ignore[misc]


def _drain_with_run(worker: Any) -> float:
    """Drive the production loop, ``Worker.run()``, in a thread until no run has finished for
    half a second, then stop it. Returns when the last run ended (wall clock)."""
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    count, changed = 0, time.time()
    while time.time() - changed < 0.5:
        time.sleep(0.02)
        if worker.runs_executed != count:
            count, changed = worker.runs_executed, time.time()
    worker.stop()
    thread.join(timeout=30)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=["drain", "serve"], default="drain")
    parser.add_argument("--no-listen", action="store_true")
    parser.add_argument("--poll-interval", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--idle-polls", type=int, default=3)
    parser.add_argument(
        "--loop", action="store_true", help="drain with Worker.run() instead of poll() calls"
    )
    parser.add_argument("--trace", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.trace:
        _install_tracing(args.trace)

    from sync import Engine

    settings = settings_for(args.url, poll_interval=args.poll_interval, batch_size=args.batch_size)
    with Engine(settings, pool_size=4) as engine:
        if args.mode == "serve":
            worker = engine.worker(listen=not args.no_listen)
            print("READY", flush=True)
            worker.run()
            return
        worker = engine.worker(listen=False)
        print("READY", flush=True)
        sys.stdin.readline()
        started = time.time()
        if args.loop:
            last = _drain_with_run(worker)
        else:
            last = started
            idle = 0
            while idle < args.idle_polls:
                if worker.poll():
                    idle = 0
                    last = time.time()
                else:
                    idle += 1
                    time.sleep(0.001)
            worker.close()
        executed = worker.runs_executed
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "executed": executed,
                "started": started,
                "last": last,
                "maxrss_kb": usage.ru_maxrss,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
