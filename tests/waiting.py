"""Waiting on what the code under test does, never on the clock: a statement of the engine
blocked on a lock (read from pg_stat_activity), a worker process that stopped itself at a known
point (``waitpid``), a line a process logs."""

from __future__ import annotations

import os
import subprocess

import psycopg

from tests.conftest import DIRECT_URL


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
