"""The one way the engine repeats a statement that failed for a passing reason.

Two kinds of failure are worth repeating:

- **transient**: the server refused the statement and rolled it back (a serialization failure,
  a deadlock, a lock timeout: another transaction won a lock or a race). Nothing was written, so
  any statement may be repeated as it is, on the same connection.
- **connection lost**: the connection broke (the database restarted, the network cut). The
  statement may or may not have committed. Only an *idempotent* statement is repeated, on a
  fresh connection: a fenced write that committed matches nothing the second time, or writes
  the same again. A claim is never repeated after a lost connection: if the first one committed
  and only its answer was lost, a second would strand the first claimed run until its lease
  runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

T = TypeVar("T")

# Statements the server refused and rolled back: another transaction won a lock or a race.
TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available (lock_timeout)
    }
)


def is_transient(exc: BaseException) -> bool:
    """A deadlock, serialization failure or lock timeout: repeat the statement."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in TRANSIENT_SQLSTATES


def is_connection_lost(exc: BaseException) -> bool:
    """The connection broke under the statement (or could not be had)."""
    return isinstance(exc, psycopg.OperationalError) and not is_transient(exc)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and for how long: a transient failure is repeated up to ``attempts`` times;
    an idempotent statement is repeated, after a transient failure or a lost connection, for up
    to ``within`` seconds (for a run's finish, most of a lease: the lease keeper stops the run
    before it runs out)."""

    attempts: int = 5
    within: float = 30.0
    sleep: Callable[[float], None] = time.sleep  # between tries; a test records the waits

    def run(self, call: Callable[[], T], *, idempotent: bool = False) -> T:
        """``call()``, repeated while it fails transiently, and, if ``idempotent``, while its
        connection is lost. An ``idempotent`` call takes its connection from the pool on each
        try (a lost connection is not used again)."""
        # The first try runs outside tenacity: nearly every statement succeeds at once, and a
        # retry loop set up for each cost more of a worker's CPU than the statement's own
        # client side. A failure worth repeating becomes the loop's first attempt.
        try:
            return call()
        except Exception as exc:
            if not (is_transient(exc) or (idempotent and is_connection_lost(exc))):
                raise
            first: Exception | None = exc

        def again() -> T:
            nonlocal first
            if first is not None:
                failed, first = first, None
                raise failed
            return call()

        for attempt in self._retrying(idempotent):
            with attempt:
                return again()
        raise AssertionError("unreachable: Retrying re-raises the last failure")

    def _retrying(self, idempotent: bool) -> Retrying:
        if idempotent:
            return Retrying(
                retry=retry_if_exception(lambda e: is_transient(e) or is_connection_lost(e)),
                stop=stop_after_delay(self.within),
                wait=wait_random_exponential(multiplier=0.5, max=5),
                sleep=self.sleep,
                reraise=True,
            )
        return Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=0.1, max=2.0),
            sleep=self.sleep,
            reraise=True,
        )


DEFAULT = RetryPolicy()
