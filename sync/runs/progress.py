"""Where a run is, for people watching it: table k of n, the partition and page being read,
records read so far and, when the provider said, how many there are. Written on the run row
with every batch (``progress`` and ``total_units``); ``connector-sync sync --wait`` and
``runs show`` display it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from sync.runs.checkpoints import RunCheckpoints, SliceCheckpoint


class RunProgress:
    """The progress of one attempt's run, kept by the executor and the record writer."""

    def __init__(self, tables: Sequence[str], checkpoints: RunCheckpoints | None = None) -> None:
        self._tables = list(tables)
        self._checkpoints = checkpoints or RunCheckpoints()
        self._table = self._tables[0] if self._tables else ""
        self._partition: str | None = None
        self._page = 0
        self._read: dict[str, int] = {}
        # Per table, per slice: the totals the provider gave, and which of them are estimates.
        self._totals: dict[str, dict[str, int]] = {}
        self._estimated: dict[str, set[str]] = {}
        for name in self._tables:
            slices = self._checkpoints.of(name)
            self._read[name] = sum(s.records for s in slices.values())
            self._totals[name] = {p: s.total for p, s in slices.items() if s.total is not None}
            self._estimated[name] = {
                p for p, s in slices.items() if s.total is not None and s.total_estimated
            }

    def begin_table(self, table: str) -> None:
        self._table = table
        self._partition = None
        self._page = 0

    def begin_slice(self, partition: str | None, checkpoint: SliceCheckpoint | None) -> None:
        self._partition = partition
        self._page = checkpoint.pages if checkpoint else 0

    def forget_table(self, table: str) -> None:
        """The table is read again from its start."""
        self._read[table] = 0
        self._totals[table] = {}
        self._estimated[table] = set()

    def page(self, number: int) -> None:
        self._page = number

    def read(self, records: int) -> None:
        self._read[self._table] = self._read.get(self._table, 0) + records

    def slice_total(self, total: int, *, estimated: bool = False) -> None:
        key = self._partition or ""
        self._totals.setdefault(self._table, {})[key] = total
        estimates = self._estimated.setdefault(self._table, set())
        if estimated:
            estimates.add(key)
        else:
            estimates.discard(key)

    def table_total(self, table: str) -> int | None:
        totals = self._totals.get(table)
        return sum(totals.values()) if totals else None

    def table_total_estimated(self, table: str) -> bool:
        """Whether the table's total adds up an estimate of some slice."""
        return bool(self._estimated.get(table))

    def run_total(self) -> int | None:
        known = [t for t in (self.table_total(name) for name in self._tables) if t is not None]
        return sum(known) if known else None

    def describe(self) -> dict[str, Any]:
        where = {
            "table": self._table,
            "table_index": self._tables.index(self._table) + 1
            if self._table in self._tables
            else 0,
            "tables": len(self._tables),
            "partition": self._partition,
            "page": self._page,
            "records": self._read.get(self._table, 0),
            "total": self.table_total(self._table),
        }
        if self.table_total_estimated(self._table):
            where["total_estimated"] = True
        return where

    def snapshot(self) -> dict[str, Any]:
        """The statement parameters that carry the progress to the run row."""
        return {"progress": Jsonb(self.describe()), "total_units": self.run_total()}
