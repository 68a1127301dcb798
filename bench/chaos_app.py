"""The application the chaos run's workers serve beside their syncs
(``connector-sync worker --app bench.chaos_app:setup``): a standard queue whose handlers are
slow and fail now and then, and an exclusive one keyed by a handful of keys."""

from __future__ import annotations

import random

from sync.queues import Abort, Job, QueuePolicy, Queues, queue_spec

STANDARD = "chaos.jobs"
EXCLUSIVE = "chaos.keyed"
LANES = f"{STANDARD}=3,{EXCLUSIVE}=1"
EXPIRE = 20.0  # an attempt may run this long; the lease is renewed within it
FAIL_RATE = 0.15


def declare(queues: Queues) -> None:
    for name, policy in ((STANDARD, QueuePolicy.STANDARD), (EXCLUSIVE, QueuePolicy.EXCLUSIVE)):
        queues.declare_queue(
            queue_spec(
                name,
                policy=policy,
                retry_limit=8,
                retry_delay=0.2,
                retry_ceiling=1.0,
                expire=EXPIRE,
            )
        )


def handle(job: Job, abort: Abort) -> None:
    if abort.wait(random.uniform(0.0, 0.4)):  # slow; stops when told to
        raise RuntimeError("stopped")
    if random.random() < FAIL_RATE:
        raise RuntimeError("a handler failure the chaos run asked for")


def setup(queues: Queues) -> None:
    declare(queues)
    queues.register(STANDARD, handle)
    queues.register(EXCLUSIVE, handle)
