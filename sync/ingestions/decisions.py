"""Pure decisions about an ingestion (or an archive expansion) after an attempt that ended with
an exception, in the one outcome vocabulary of every kind: what the exception means (a refusal
no retry can help, a file that is gone, a wait, a retryable fault) and what to do next (finish
``failed`` or ``cancelled``, requeue after the engine's backoff, wait for a rate limit, hand
back, stop). A database error means what it means for a run
(:func:`sync.jobs.outcome.database_error`), and the backoff is the runs'. Messages are redacted:
a secret the engine knows (an endpoint's API key) never reaches the ingestion's error. No I/O
here."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import psycopg

from connectors.errors import Aborted, ConnectorError, FileGone, RateLimited, RetryableError
from sync.base import redact
from sync.base.abort import AbortReason
from sync.documents import DocumentError
from sync.errors import LeaseLost
from sync.ingestions.sources import SourceGone
from sync.ingestions.store import CheckpointLost
from sync.jobs.connectors import ConnectorSetupError
from sync.jobs.outcome import (
    DEFAULT_BACKOFF,
    DEFAULT_JITTER,
    Action,
    Backoff,
    Outcome,
    database_error,
)
from sync.store.db import first_line
from sync.vocabulary import ErrorKind, JobError

FAILED = "failed"
CANCELLED = "cancelled"


def error_of(exc: BaseException) -> JobError:
    """What an exception that ended an attempt was, as the ingestion's error."""
    if isinstance(exc, DocumentError):  # unreadable, or an archive refused
        return JobError(ErrorKind.DOCUMENT, str(exc))
    if isinstance(exc, ConnectorSetupError):
        return exc.error
    if isinstance(exc, SourceGone):
        return JobError(ErrorKind.GONE, str(exc))
    if isinstance(exc, CheckpointLost):
        return JobError(ErrorKind.DATABASE, str(exc))
    if isinstance(exc, ConnectorError):
        return JobError.of(exc)
    if isinstance(exc, psycopg.Error):
        return database_error(exc)
    text = first_line(exc)
    name = type(exc).__name__
    message = f"unexpected error: {name}: {text}" if text != name else text
    return JobError(ErrorKind.INTERNAL, message)


def after_failure(
    exc: BaseException,
    *,
    abort: AbortReason | None,
    attempts: int,
    max_attempts: int,
    schedule: Sequence[float] = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """What to do after attempt number ``attempts`` ended with ``exc`` (``abort``: why its
    abort signal tripped, if it did). A lost lease writes nothing more; a shutdown hands the
    ingestion back; a cancel, or a file that is gone, ends it ``cancelled``; a rate limit waits
    its Retry-After without spending the attempt; another retryable fault is retried after the
    engine's backoff while attempts remain; anything else ends it ``failed``."""
    if isinstance(exc, LeaseLost) or abort is AbortReason.LEASE_LOST:
        return Outcome(Action.STOP)
    if abort is AbortReason.SHUTDOWN:
        return Outcome(Action.HAND_BACK)
    if abort is AbortReason.CANCELLED:
        error = JobError(ErrorKind.CANCELLED, "a cancel was requested")
        return Outcome(Action.FINISH, CANCELLED, error=error)
    if isinstance(exc, SourceGone | FileGone):
        return Outcome(Action.FINISH, CANCELLED, error=JobError(ErrorKind.GONE, str(exc)))
    if abort is AbortReason.TIMEOUT:
        exc = RetryableError("the ingestion exceeded its timeout")
    elif isinstance(exc, Aborted):
        exc = RetryableError("the attempt was interrupted")
    error = error_of(exc)
    error = error.with_message(redact.redact(error.message))
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        return Outcome(Action.WAIT, delay=float(exc.retry_after), error=error)
    if not error.is_retryable:
        return Outcome(Action.FINISH, FAILED, error=error)
    if attempts < max_attempts:
        delay = Backoff(schedule, jitter=jitter).delay(attempts, rand)
        return Outcome(Action.REQUEUE, delay=delay, error=error)
    gave_up = error.with_message(f"gave up after {attempts} attempt(s): {error.message}")
    return Outcome(Action.FINISH, FAILED, error=gave_up)
