"""Lanes: how many jobs of each queue one worker process runs at once, from configuration
(``CONNECTOR_SYNC_LANES="knowledge.ingest=4,knowledge.sync=1"``). A process configured with no
lanes serves no queue, so a replica that only sends jobs stays one."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from sync.errors import InvalidInput
from sync.queues.declarations import QUEUE_NAME_PATTERN

LANES_ENV = "CONNECTOR_SYNC_LANES"
MAX_LANES = 64
_FORMAT = "write QUEUE=N[,QUEUE=N...], such as knowledge.ingest=4,knowledge.sync=1"
_NAME = re.compile(QUEUE_NAME_PATTERN)
_COUNT = re.compile(r"[0-9]{1,3}")


def parse_lanes(text: str | None, *, source: str = LANES_ENV) -> dict[str, int]:
    """Lane counts by queue; empty for no text. Zero lanes is allowed and serves nothing."""
    lanes: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, count = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise InvalidInput(f"{source}: {item!r} is not QUEUE=N; {_FORMAT}")
        if not _NAME.match(name):
            raise InvalidInput(f"{source}: {name!r} is not a queue name; {_FORMAT}")
        if not _COUNT.fullmatch(count) or int(count) > MAX_LANES:
            raise InvalidInput(
                f"{source}: the lanes of {name!r} must be a whole number from 0 to "
                f"{MAX_LANES}, not {count!r}"
            )
        if name in lanes:
            raise InvalidInput(f"{source}: {name!r} is given twice; give each queue once")
        lanes[name] = int(count)
    return lanes


def served_queues(
    lanes: Mapping[str, int], registered: Collection[str], *, source: str = LANES_ENV
) -> dict[str, int]:
    """The queues a process claims from, with their lanes: each with at least one lane. A lane
    for a queue that has no handler in this process is refused, since its jobs would wait for
    a handler that never comes."""
    orphans = sorted(name for name, count in lanes.items() if count and name not in registered)
    if orphans:
        raise InvalidInput(
            f"{source} gives lanes to {', '.join(orphans)}, with no handler registered in this "
            "process; register one, or take the queue out of the lanes"
        )
    return {name: count for name, count in lanes.items() if count > 0}
