"""Where a run's tables got to: one checkpoint per slice (a table, or one partition of it),
saved with the batches it follows (``sync.runs.records``) and read back when a later attempt of the
same run starts, so that it resumes every unfinished slice at its last committed position.

Also the guard on the keys a run has seen. They live in ``run_seen_keys``, an unlogged table
(cheap to fill, never written to the WAL), which a crash restart of Postgres empties. The
checkpoints count them in the batches' own, logged, transactions; a table whose saved count is
more than ``run_seen_keys`` holds has lost keys, and tombstoning from that partial set would
delete live rows. Such a table is read again from its start instead."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sync.store import SliceRow


@dataclass(frozen=True)
class SliceCheckpoint:
    """One slice of a table as an earlier attempt of the run left it."""

    position: Any  # what the connector yielded as its position; None: from the start
    done: bool  # read to its end in this run
    resync: bool  # the read lists the whole slice: unseen rows are tombstoned
    pages: int
    records: int
    total: int | None
    total_estimated: bool  # the total is the provider's estimate
    seen: int  # keys put in run_seen_keys


class RunCheckpoints:
    """The checkpoints of one run, by table and partition ('' for a table read whole)."""

    def __init__(self, rows: Iterable[SliceRow] = ()) -> None:
        self._slices: dict[str, dict[str, SliceCheckpoint]] = {}
        for row in rows:
            table = self._slices.setdefault(row.table_name, {})
            table[row.partition] = SliceCheckpoint(
                position=row.position,
                done=row.done,
                resync=row.resync,
                pages=row.pages,
                records=row.records,
                total=row.total,
                total_estimated=row.total_estimated,
                seen=row.seen,
            )

    def of(self, table: str) -> dict[str, SliceCheckpoint]:
        return self._slices.get(table, {})

    def get(self, table: str, partition: str | None) -> SliceCheckpoint | None:
        return self.of(table).get(partition or "")

    def position(self, table: str, partition: str | None) -> Any | None:
        found = self.get(table, partition)
        return None if found is None or found.done else found.position

    def forget(self, table: str) -> None:
        self._slices.pop(table, None)

    def forget_slice(self, table: str, partition: str | None) -> None:
        self._slices.get(table, {}).pop(partition or "", None)

    def mark_done(self, table: str, partition: str | None, *, resync: bool) -> None:
        """A slice this attempt read to its end (its checkpoint committed with its last batch)."""
        key = partition or ""
        previous = self.of(table).get(key)
        self._slices.setdefault(table, {})[key] = SliceCheckpoint(
            position=None,
            done=True,
            resync=resync or bool(previous and previous.resync),
            pages=previous.pages if previous else 0,
            records=previous.records if previous else 0,
            total=previous.total if previous else None,
            total_estimated=previous.total_estimated if previous else False,
            seen=previous.seen if previous else 0,
        )
