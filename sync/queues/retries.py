"""Pure decisions about an application job after an attempt, in the one outcome vocabulary of
every kind: complete it, retry it after a delay that doubles from the queue's base up to its
ceiling (with jitter), or dead-letter it. No I/O here; every implementation of the port applies
what these return."""

from __future__ import annotations

import random
from collections.abc import Callable

from sync.jobs.outcome import Action, Backoff, Outcome
from sync.queues.declarations import QueueSpec
from sync.queues.models import AttemptOutcome, JobStatus

COMPLETE = Outcome(Action.FINISH, JobStatus.COMPLETED)
DEAD = Outcome(Action.FINISH, JobStatus.DEAD)


def backoff(queue: QueueSpec) -> Backoff:
    """A queue's retries: from its ``retry_delay``, doubling, up to its ``retry_ceiling``."""
    return Backoff(base=queue.retry_delay, ceiling=queue.retry_ceiling)


def fate_after(
    outcome: AttemptOutcome,
    *,
    attempts: int,
    queue: QueueSpec,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """What becomes of a job whose attempt number ``attempts`` ended with ``outcome``: it
    finishes ``completed``, is requeued after a delay, or finishes ``dead``.

    A failed attempt is retried after the queue's :func:`backoff` while its retry limit allows;
    an attempt that outlived the queue's expiry is retried at once by the claim that took it
    back. Either one dead-letters the job once its attempts are spent. A cancelled attempt has
    no fate to decide: the cancel already ended the job."""
    if outcome is AttemptOutcome.COMPLETED:
        return COMPLETE
    if outcome is AttemptOutcome.CANCELLED:
        raise ValueError("a cancelled attempt's job is already cancelled")
    if attempts >= queue.attempts_allowed:
        return DEAD
    if outcome is AttemptOutcome.EXPIRED:
        return Outcome(Action.REQUEUE, delay=0.0)
    return Outcome(Action.REQUEUE, delay=backoff(queue).delay(attempts, rand))
