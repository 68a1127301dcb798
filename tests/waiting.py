"""Waiting on what the code under test does, never on the clock: a condition checked again at
each emission of one of the engine's signals, a statement of the engine blocked on a lock (read
from pg_stat_activity), a worker process that stopped itself at a known point (``waitpid``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg

from sync.base.signals import TestSignal
from tests.conftest import DIRECT_URL


def until(condition: Callable[[], Any], signal: TestSignal, timeout: float = 60.0) -> None:
    """Until ``condition`` holds, checked now and again after each emission of ``signal`` (the
    event that can make it true); ``timeout`` only bounds a test that is broken."""
    while True:
        seen = signal.count
        if condition():
            return
        if not signal.wait_for(seen + 1, timeout):
            raise AssertionError("the condition did not come true, and the signal went quiet")


def poll_until(condition: Callable[[], Any], timeout: float = 60.0) -> None:
    """Until ``condition`` holds, reading it every 50 ms. Only for a state that another process
    writes and nothing signals to this one (an application-queue worker process completing its
    jobs): everything else waits on a signal."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def wait_until_blocked(schema: str, *, reads: int = 1_000_000) -> None:
    """Until a statement of the engine on ``schema`` waits for a lock. Each check is a round
    trip on a connection of its own; ``reads`` only bounds a test whose statement never blocks."""
    with psycopg.connect(DIRECT_URL, autocommit=True) as watcher:
        for _ in range(reads):
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'",
                (f"connector-sync/{schema}",),
            ).fetchone()
            if waiting and waiting[0]:
                return
    raise AssertionError(f"no statement of the engine on {schema} waited for a lock")


def wait_stopped(process: subprocess.Popen[str]) -> None:
    """Until ``process`` is stopped (SIGSTOP, e.g. by itself: see the filedata connector's
    ``pause_after``); raises if it exited instead."""
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        raise AssertionError(f"the process ended (status {status}) instead of stopping")
