"""Who may join a queue: the singleton slot a job of an exclusive queue holds while it is
pending, and the rules for keys and start times that a send must follow."""

from __future__ import annotations

from datetime import datetime, timedelta

from sync.errors import InvalidInput
from sync.queues.declarations import QueueSpec
from sync.queues.models import QueuePolicy

MAX_KEY_LENGTH = 200
# The slot of an exclusive queue's jobs sent without a key: the queue holds one such job at a
# time (a sweep that must never stack behind itself).
WHOLE_QUEUE = ""


def singleton_slot(queue: QueueSpec, key: str | None) -> str | None:
    """The slot a pending job of ``queue`` with ``key`` holds: None on a standard queue (no
    limit), the key (or the whole queue, without one) on an exclusive queue. Two pending jobs
    of one queue never hold the same slot."""
    if queue.policy is QueuePolicy.STANDARD:
        return None
    return WHOLE_QUEUE if key is None else key


def check_key(queue: QueueSpec, key: str | None) -> None:
    if key is None:
        return
    if queue.policy is QueuePolicy.STANDARD:
        raise key_on_standard(queue.name)
    check_key_text(queue.name, key)


def key_on_standard(queue: str) -> InvalidInput:
    return InvalidInput(
        f"queue {queue!r} is standard and runs every job it is sent, so a key would "
        "change nothing; send without a key, or declare the queue exclusive"
    )


def check_key_text(queue: str, key: str | None) -> None:
    """A key is a short string without NUL, whatever the queue's policy."""
    if key is None:
        return
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidInput(
            f"the key of a job for queue {queue!r} must be a string of 1 to "
            f"{MAX_KEY_LENGTH} characters without NUL"
        )


def due_time(now: datetime, start_after: datetime | timedelta | None) -> datetime:
    """When a job sent at ``now`` becomes due: at once, after a delay, or at a given time."""
    if start_after is None:
        return now
    if isinstance(start_after, timedelta):
        return now + max(start_after, timedelta(0))
    if isinstance(start_after, datetime):
        if start_after.tzinfo is None:
            raise InvalidInput(
                "start_after must be timezone-aware (datetime.now(UTC) + ...), or a timedelta"
            )
        return max(start_after, now)
    raise InvalidInput("start_after must be a datetime, a timedelta or None")
