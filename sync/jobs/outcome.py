"""The one outcome vocabulary of every kind of leased work, and its pure parts: what to do
with a claimed unit after an attempt (:class:`Outcome`), the backoff before the next attempt
(:class:`Backoff`), and what a database error means for any kind (:func:`database_error`). No
I/O here: a kind decides with these, and applies what they say with its own fenced writes."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import psycopg

from sync.store.db import first_line
from sync.store.retry import is_connection_lost, is_transient
from sync.vocabulary import ErrorKind, JobError

# The runs' steps: 5 s, 30 s, 2 min after attempts 1, 2, 3.
DEFAULT_BACKOFF: tuple[float, ...] = (5.0, 30.0, 120.0)
# Each delay times a random factor in [0.8, 1.2], so that work that failed together (a provider
# outage) does not all come back in the same second.
DEFAULT_JITTER = 0.2
# Past this many doublings every delay is the ceiling (2 ** 64 seconds exceeds any ceiling).
_MAX_DOUBLINGS = 64


@dataclass(frozen=True)
class Backoff:
    """How long to wait after a failed attempt: fixed ``steps`` (a run's 5 s, 30 s, 2 min; the
    last one past their end), or, without steps, a delay that doubles from ``base`` (an
    application queue's retry delay); either capped at ``ceiling`` and times a random factor in
    [1 - jitter, 1 + jitter], never past the ceiling."""

    steps: Sequence[float] = ()
    base: float = 0.0
    ceiling: float = math.inf
    jitter: float = DEFAULT_JITTER

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds before the attempt that follows failure number ``failures`` (1-based)."""
        failures = max(failures, 1)
        if self.steps:
            nominal = self.steps[min(failures, len(self.steps)) - 1]
        else:
            nominal = self.base * 2.0 ** min(failures - 1, _MAX_DOUBLINGS)
        nominal = min(nominal, self.ceiling)
        return min(self.ceiling, nominal * (1 - self.jitter + 2 * self.jitter * rand()))


def database_error(exc: psycopg.Error, *, what: str = "a value") -> JobError:
    """What a database error that ended an attempt means, the same for every kind (a run's
    table or attempt, a purge, an application job, an ingestion), so an error is retried or not
    whoever met it:

    - a transient failure (the server rolled the statement back: a deadlock, a serialization
      failure, a lock timeout; see :func:`sync.store.retry.is_transient`) or a lost connection:
      ``database``, retried after the backoff while attempts remain; the next attempt will
      most likely not meet it;
    - Postgres refused the data (SQLSTATE class 22, a data exception; class 23, a violated
      check, not-null, unique or foreign-key constraint): ``record``, permanent, since the same
      data is refused the same way on every attempt; ``what`` names the data in the message;
    - anything else (a schema behind its code, a resource limit, a bug): ``database``, retried
      like any unexpected failure while attempts remain, then failed with them spent."""
    line = first_line(exc)
    if not (is_transient(exc) or is_connection_lost(exc)) and isinstance(
        exc, psycopg.DataError | psycopg.IntegrityError
    ):
        return JobError(ErrorKind.RECORD, f"Postgres rejected {what}: {line}")
    return JobError(ErrorKind.DATABASE, f"database error: {line}")


class Action(StrEnum):
    """What becomes of a claimed unit after an attempt, whatever its kind."""

    FINISH = "finish"  # it ends, with `status` (a run's, a job's or an ingestion's own word)
    REQUEUE = "requeue"  # back to its queue, due after `delay`; the attempt is spent
    HAND_BACK = "hand_back"  # shutdown: back to its queue now, the attempt not spent
    WAIT = "wait"  # a rate limit: back to its queue until the reset, the attempt not spent
    STOP = "stop"  # the lease is lost: write nothing more


@dataclass(frozen=True)
class Outcome:
    """The decision about one unit after an attempt, as its kind's pure decision gives it."""

    action: Action
    status: str | None = None  # Action.FINISH: the status it ends in, in its kind's words
    delay: float | None = None
    error: JobError | None = field(default=None)
    waiting_for: str | None = None  # Action.WAIT: what it waits for

    @property
    def label(self) -> str:
        """How the attempt ended, as a metric label: the status it finished with, else what
        happened to it (requeue, wait, hand_back, stop)."""
        if self.action is Action.FINISH:
            return self.status or "finished"
        return self.action.value
