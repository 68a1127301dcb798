"""A worker process for tests: `python -m tests.worker_process --schema S [options]`.

It loads the test connectors, then either runs the normal worker loop until SIGTERM (`loop`) or
polls until no run is left waiting, queued or running (`drain`, for stress tests): between polls
that found nothing it waits as the worker loop does, for a NOTIFY (a run finished while others
are due) or the poll interval."""

from __future__ import annotations

import argparse
import logging
import sys
import threading

import tests.fakes  # noqa: F401 - registers the test connectors
from sync import Engine
from sync.worker import Listener
from tests.conftest import make_settings

PENDING = (
    "SELECT EXISTS (SELECT 1 FROM connection_runs WHERE status IN ('waiting', 'queued', "
    "'running')) AS pending"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schema", required=True)
    parser.add_argument("--mode", choices=["loop", "drain"], default="loop")
    parser.add_argument("--worker-id")
    parser.add_argument("--lease-seconds", type=float, default=120.0)
    parser.add_argument("--control-interval", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--app", action="append", default=[], help="module:function")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    settings = make_settings(
        args.schema,
        lease_seconds=args.lease_seconds,
        control_interval=args.control_interval,
        batch_size=args.batch_size,
        poll_interval=0.2,
    )
    # The tests pass the key through the environment so credentials stay readable.
    with Engine(settings, pool_size=4) as engine:
        if args.mode == "loop":
            engine.worker(worker_id=args.worker_id, apps=args.app).run()
            return
        worker = engine.worker(worker_id=args.worker_id, listen=False)
        wake = threading.Event()
        listener = Listener(settings, engine.url, wake)
        listener.start()
        try:
            while True:
                wake.clear()
                if worker.poll():
                    continue
                with engine.pool.connection() as conn:
                    row = conn.execute(PENDING).fetchone()
                if not row or not row["pending"]:
                    break
                wake.wait(settings.poll_interval)
        finally:
            listener.stop()
            worker.close()
        print(f"executed {worker.runs_executed}", flush=True)


if __name__ == "__main__":
    main()
