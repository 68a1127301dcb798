"""The simulated provider table of bench/records.py: ``n`` records of about 1 KB of JSON each,
generated on the fly (never held in memory), in pages. The same generator feeds our connector,
the COPY ceiling and dlt, so every contender pays the same cost to produce the records.

A phase changes the data the way a provider would between syncs: ``changed_epoch`` rewrites
every ``changed_every``-th record, ``deleted_every`` drops every ``deleted_every``-th one.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_STATUSES = ("open", "in_progress", "blocked", "done")
# A few hundred distinct bodies: varied enough that no page compresses to nothing, cheap to
# produce.
_BODIES = [
    "".join(random.Random(k).choices(string.ascii_letters + "      ", k=760)) for k in range(257)
]


@dataclass(frozen=True)
class Phase:
    name: str
    changed_epoch: int = 0
    changed_every: int = 100
    deleted_every: int = 0
    # The server's wal_compression for the writing sessions of this phase (None: as configured).
    wal_compression: str | None = None


FIRST = Phase("first sync (all new)")
CHANGED = Phase("resync, 1 % changed", changed_epoch=1)
# The same change again (other values, the same rows), with full-page images compressed: the
# operator's lever on what a resync right after a checkpoint writes.
COMPRESSED = Phase(
    "resync, 1 % changed, wal_compression=lz4", changed_epoch=2, wal_compression="lz4"
)
DELETED = Phase("resync, 1 % deleted", changed_epoch=2, deleted_every=100)
PHASES = (FIRST, CHANGED, COMPRESSED, DELETED)


def record(i: int, version: int) -> dict[str, Any]:
    return {
        "id": i,
        "title": f"Item {i}: quarterly report for site {i % 977}",
        "status": _STATUSES[i % 4],
        "owner": f"user{i % 1000}@example.com",
        "priority": i % 5,
        "version": version,
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": f"2024-02-{1 + version:02d}T12:00:00Z",
        "body": _BODIES[i % len(_BODIES)],
    }


def records(n: int, phase: Phase) -> Iterator[dict[str, Any]]:
    half = phase.deleted_every // 2
    for i in range(n):
        if phase.deleted_every and i % phase.deleted_every == half:
            continue
        changed = phase.changed_epoch and i % phase.changed_every == 0
        yield record(i, phase.changed_epoch if changed else 0)


def pages(n: int, phase: Phase, page_size: int) -> Iterator[list[dict[str, Any]]]:
    page: list[dict[str, Any]] = []
    for item in records(n, phase):
        page.append(item)
        if len(page) >= page_size:
            yield page
            page = []
    if page:
        yield page


def phase_named(name: str) -> Phase:
    for phase in PHASES:
        if phase.name == name:
            return phase
    raise KeyError(name)
