"""Pure decisions about a job after an attempt: complete it, retry it after a delay that doubles
from the queue's base up to its ceiling (with jitter), or dead-letter it. No I/O here; every
implementation of the port applies what these return."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from sync.queues.declarations import QueueSpec
from sync.queues.models import AttemptOutcome

# Each delay is the doubled one times a random factor in [0.8, 1.2], so that jobs that failed
# together (a provider outage) do not all come back in the same second.
JITTER = 0.2
# Past this many doublings every delay is the ceiling (2 ** 64 seconds exceeds any ceiling).
_MAX_DOUBLINGS = 64


def retry_delay(
    failures: int,
    *,
    base: float,
    ceiling: float,
    jitter: float = JITTER,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds before the retry that follows failure number ``failures`` (1-based): ``base``
    doubled for each failure before it, at most ``ceiling``, times a random factor in
    [1 - jitter, 1 + jitter], and never past ``ceiling``."""
    doublings = min(max(failures, 1) - 1, _MAX_DOUBLINGS)
    nominal = min(ceiling, base * 2.0**doublings)
    return min(ceiling, nominal * (1 - jitter + 2 * jitter * rand()))


class Fate(StrEnum):
    COMPLETE = "complete"
    RETRY = "retry"  # queued again, due after `delay` (0: the claim that found it runs it)
    DEAD = "dead"  # out of attempts: into the dead-letter queue, and the on_dead hook runs


@dataclass(frozen=True)
class Decision:
    fate: Fate
    delay: float = 0.0


def fate_after(
    outcome: AttemptOutcome,
    *,
    attempts: int,
    queue: QueueSpec,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """What becomes of a job whose attempt number ``attempts`` ended with ``outcome``.

    A failed attempt is retried after :func:`retry_delay` while the queue's retry limit allows;
    an attempt that outlived the queue's expiry is retried at once by the claim that took it
    back. Either one dead-letters the job once its attempts are spent. A cancelled attempt has
    no fate to decide: the cancel already ended the job."""
    if outcome is AttemptOutcome.COMPLETED:
        return Decision(Fate.COMPLETE)
    if outcome is AttemptOutcome.CANCELLED:
        raise ValueError("a cancelled attempt's job is already cancelled")
    if attempts >= queue.attempts_allowed:
        return Decision(Fate.DEAD)
    if outcome is AttemptOutcome.EXPIRED:
        return Decision(Fate.RETRY)
    delay = retry_delay(attempts, base=queue.retry_delay, ceiling=queue.retry_ceiling, rand=rand)
    return Decision(Fate.RETRY, delay)
