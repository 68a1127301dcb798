"""Pure decisions about an ingestion attempt that ended early: what its exception means (a
refusal no retry can help, a file that is gone, a wait, a retryable fault) and what to do next
(fail, end, requeue after the engine's backoff). A database error means what it means for a run
(:func:`sync.jobs.outcome.database_error`), and the delay is the runs' backoff. Messages are
redacted: a secret the engine knows (an endpoint's API key) never reaches the ingestion's
error. No I/O here."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg

from connectors.errors import ConnectorError, FileGone, PermanentError, RateLimited, RetryableError
from sync.base import redact
from sync.documents import DocumentError
from sync.documents.errors import ArchiveRefused
from sync.jobs.connectors import ConnectorSetupError
from sync.jobs.outcome import DEFAULT_BACKOFF, DEFAULT_JITTER, backoff_delay, database_error
from sync.store.db import first_line


class Next(StrEnum):
    FAIL = "failed"  # for good: the same input fails the same way
    CANCEL = "cancelled"  # nothing left to index: the file is gone
    REQUEUE = "queued"  # try again after `delay`


@dataclass(frozen=True)
class Decision:
    next: Next
    error: dict[str, Any]
    delay: float = 0.0
    spend_attempt: bool = True


def classify(exc: BaseException) -> tuple[str, str, bool]:
    """``(kind, message, retryable)`` of an exception that ended an attempt."""
    if isinstance(exc, ArchiveRefused):
        return "archive_refused", str(exc), False
    if isinstance(exc, DocumentError):
        return "document", str(exc), False
    if isinstance(exc, ConnectorSetupError):
        return "config", str(exc), False
    if isinstance(exc, FileGone):
        return "file_gone", exc.message, False
    if isinstance(exc, RetryableError):  # RateLimited too
        return exc.kind, exc.message, True
    if isinstance(exc, PermanentError | ConnectorError):
        return exc.kind, exc.message, False
    if isinstance(exc, psycopg.Error):
        error = database_error(exc)
        return error.kind.value, error.message, error.is_retryable
    text = first_line(exc)
    name = type(exc).__name__
    return "internal", f"unexpected error: {name}: {text}" if text != name else text, True


def after_failure(
    exc: BaseException,
    *,
    attempts: int,
    max_attempts: int,
    schedule: Sequence[float] = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """What to do after attempt number ``attempts`` ended with ``exc``. A rate limit waits its
    Retry-After without spending the attempt; another retryable fault is retried after the
    engine's backoff while attempts remain; anything else ends the ingestion."""
    kind, message, retryable = classify(exc)
    message = redact.redact(message)
    error = {"kind": kind, "message": message}
    if kind == "file_gone":
        return Decision(Next.CANCEL, error)
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        return Decision(Next.REQUEUE, error, delay=float(exc.retry_after), spend_attempt=False)
    if not retryable:
        return Decision(Next.FAIL, error)
    if attempts < max_attempts:
        return Decision(Next.REQUEUE, error, delay=backoff_delay(attempts, schedule, jitter, rand))
    return Decision(
        Next.FAIL, {**error, "message": f"gave up after {attempts} attempt(s): {message}"}
    )
