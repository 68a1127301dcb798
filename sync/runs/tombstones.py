"""The tombstone pass: once a table (or some of its partitions) has been read completely within
a run, its live rows that no attempt of the run wrote or saw are gone upstream.

For most tables that is proof enough, and the pass tombstones them in bounded steps, each a
short fenced statement (``tombstone_unseen``). A table whose listing can shift (page numbers,
offsets) proves nothing by a missing key: a deletion on page 1 moves the first item of page 2
onto page 1 after page 1 was read, and that item is never seen. For such a table the pass only
collects the missing rows (``unseen_rows``) and asks the connector to confirm each one with the
provider (``Connector.confirm_deleted``, bounded by ``Table.confirm_limit`` per partition and
spending the same rate budget as the reads); what the provider confirms is tombstoned, what it
shows alive is kept. Keys the connector cannot confirm (no per-item read, or past the bound) are
tombstoned only when a second complete listing misses them too (``mark_missing``).

A partition is gone as a whole when the listing that defines the table's partitions no longer
holds it (a project made inactive, a repository removed from the config), or when its read
answers 404 (or 410) at a second sync in a row: its live rows are tombstoned without asking the
provider about each (``partitions_gone``, then ``TombstonePass.tombstone_partitions``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from connectors.base import Table
from sync.base.abort import AbortSignal
from sync.store import Lease, TableWrites

Confirm = Callable[[str | None, Mapping[str, Mapping[str, Any]]], Collection[str] | None]
"""The connector's confirmation for one partition (None for a table read whole)."""


@dataclass
class _Missing:
    """The rows of one partition that the complete read did not see."""

    to_confirm: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    beyond_bound: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PartitionsGone:
    """What a sync's listing of a table's partitions says, beside the last sync's."""

    gone: list[str]
    """Partitions whose rows are tombstoned now: no longer listed, or answering 404 again."""
    absent: dict[str, int]
    """Listed partitions that answered 404, each with the run that first met the 404."""
    changed: bool
    """Whether the saved listing changes (nothing is written when it does not)."""


def partitions_gone(
    saved: Sequence[str],
    absent_before: Mapping[str, int],
    listed: Sequence[str],
    absent_now: Collection[str],
    run_id: int,
) -> PartitionsGone:
    """Which partitions are gone (pure): those the last sync listed that this one does not,
    and those that answered 404 to this run after a 404 to an earlier run. A first 404 only
    notes the run; a partition that reads again is no longer absent."""
    listing = set(listed)
    absent = {p: int(absent_before.get(p, run_id)) for p in absent_now if p in listing}
    gone = sorted(
        {p for p in saved if p not in listing}
        | {p for p, since in absent.items() if since != run_id}
    )
    changed = bool(gone) or list(saved) != list(listed) or absent != dict(absent_before)
    return PartitionsGone(gone, absent, changed)


class TombstonePass:
    def __init__(
        self,
        conn: psycopg.Connection[Any],
        lease: Lease,
        connection_id: int,
        table: Table,
        abort: AbortSignal,
        *,
        step: int,
    ) -> None:
        """``step``: stored rows per step of the pass (``Settings.tombstone_step``)."""
        self._writes = TableWrites(conn, lease, connection_id, table.name)
        self._table = table
        self._abort = abort
        self._step = step

    def run(
        self,
        whole: list[str],
        *,
        every_partition: bool,
        confirm: Confirm | None,
        all_seen: bool = False,
    ) -> dict[str, int] | None:
        """Tombstone the unseen rows of the slices read whole (``whole``: partitions, or ['']
        for a table read whole), and stamp their complete passes. When ``every_partition`` was
        read whole the pass covers the whole table (rows of partitions no longer listed too),
        and stamps the table's complete pass. Returns the rows tombstoned per partition (''
        for a table read whole), or None, having written nothing, when the keys this run saw
        of the table were lost (a crash restart of Postgres): the table must be read again.
        ``all_seen``: every row of the table was written by this attempt (it held none when the
        attempt began writing it), so no step is taken and only the passes are stamped."""
        partitions = None if every_partition else whole
        stamped = [p for p in whole if p]
        if all_seen:
            self._abort.check()
            self._writes.complete_table(stamp=every_partition, partitions=stamped)
            return {}
        if self._table.shifting:
            if not self._writes.seen_keys_intact():
                return None
            gone = self._confirmed(partitions, confirm)
        else:
            # The seen-key check, the first step and, when the table's rows fit in one step,
            # the stamp, in one round trip.
            self._abort.check()
            end = self._writes.end_table(
                partitions, whole=stamped, stamp=every_partition, limit=self._step
            )
            if not end.intact:
                return None
            gone = dict(end.tombstoned)
            if end.completed:
                return gone
            _add(gone, self._unconfirmed(partitions, after=end.step.last_key or ""))
        self._writes.complete_table(stamp=every_partition, partitions=stamped)
        return gone

    def tombstone_partitions(self, gone: list[str]) -> dict[str, int]:
        """Tombstone every live row of partitions that are gone, in bounded steps; how many per
        partition."""
        tombstoned: dict[str, int] = {}
        after = ""
        while True:
            self._abort.check()
            step = self._writes.tombstone_partitions_step(gone, after, self._step)
            _add(tombstoned, step.tombstoned)
            if step.scanned < self._step or step.last_key is None:
                return tombstoned
            after = step.last_key

    def _unconfirmed(self, partitions: list[str] | None, *, after: str) -> dict[str, int]:
        gone: dict[str, int] = {}
        while True:
            self._abort.check()
            step = self._writes.tombstone_step(partitions, after, self._step)
            _add(gone, step.tombstoned)
            if step.scanned < self._step or step.last_key is None:
                return gone
            after = step.last_key

    def _confirmed(self, partitions: list[str] | None, confirm: Confirm | None) -> dict[str, int]:
        missing: dict[str, _Missing] = {}
        after = ""
        while True:
            self._abort.check()
            unseen = self._writes.unseen_step(partitions, after, self._step)
            for found in unseen.unseen:
                part = missing.setdefault(found["partition"] or "", _Missing())
                if len(part.to_confirm) < self._table.confirm_limit:
                    part.to_confirm[found["external_id"]] = found["data"]
                else:
                    part.beyond_bound.append(found["external_id"])
            if unseen.scanned < self._step or unseen.last_key is None:
                break
            after = unseen.last_key
        gone: dict[str, int] = {}
        for name, part in missing.items():
            self._abort.check()
            unconfirmed = part.beyond_bound
            confirmed = confirm(name or None, part.to_confirm) if confirm else None
            if confirmed is None:
                unconfirmed = [*part.to_confirm, *unconfirmed]
            elif confirmed:
                known = [key for key in confirmed if key in part.to_confirm]
                _add(gone, self._writes.tombstone_ids(known))
            if unconfirmed:
                _add(gone, self._writes.mark_missing(unconfirmed))
        return gone


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, n in counts.items():
        into[name] = into.get(name, 0) + int(n)
