"""What an attempt learns of a table's slices (the table read whole, or each of its partitions):
each slice's result in this attempt beside what earlier attempts of the run left, which
partitions answered 404, and which slices of an incremental table are due a complete read."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sync.runs.checkpoints import SliceCheckpoint
from sync.runs.decide import TableResult, table_status
from sync.store import CompletePasses
from sync.vocabulary import ErrorKind, JobError, TableStatus


class SliceResults:
    """This attempt's results for the slices of one table (keyed '' for a table read whole),
    beside what earlier attempts of the run left."""

    def __init__(self, before: TableResult | None) -> None:
        self._before = dict((before.partitions or {}) if before else {})
        # A table an operator's retry made pending again reads its failed partitions again.
        self._retried = before is None or before.status is TableStatus.PENDING
        self._parts: dict[str, TableResult] = {}
        self._failure: tuple[TableStatus, JobError | None] | None = None

    def failed_before(self, name: str | None) -> bool:
        """A partition an earlier attempt gave up for good is not read again."""
        prior = self._before.get(name or "")
        return (
            name is not None
            and not self._retried
            and prior is not None
            and prior.status is TableStatus.FAILED
        )

    def failed(self, name: str | None) -> bool:
        now = self._parts.get(name or "")
        return self.failed_before(name) or (now is not None and now.status is TableStatus.FAILED)

    def add(self, name: str | None, result: TableResult) -> None:
        self._parts[name or ""] = result

    def tombstoned(self, gone: Mapping[str, int]) -> None:
        for name, n in gone.items():
            part = self._parts.setdefault(name, TableResult(TableStatus.SUCCEEDED))
            part.tombstoned += n

    def absent(self, names: list[str]) -> list[str]:
        """The partitions whose read answered 404 (or 410), in this attempt or an earlier one
        of the run."""
        found = []
        for name in names:
            latest = self._parts.get(name) or (
                self._before.get(name) if not self._retried else None
            )
            error = latest.error if latest else None
            if (
                latest
                and latest.status is TableStatus.FAILED
                and error
                and error.kind is ErrorKind.GONE
            ):
                found.append(name)
        return found

    def gone(self, names: list[str], tombstoned: Mapping[str, int]) -> None:
        """Partitions found gone as a whole: each settled, with the rows tombstoned."""
        for name in names:
            self._parts[name] = TableResult(
                TableStatus.SUCCEEDED, tombstoned=tombstoned.get(name, 0)
            )

    def fail_table(self, status: TableStatus, error: JobError | None) -> None:
        self._failure = (status, error)

    def result(
        self,
        names: list[str | None] | None,
        slices: Mapping[str, Any],
        total: int | None,
        total_estimated: bool,
    ) -> TableResult:
        counts = (
            sum(p.upserted for p in self._parts.values()),
            sum(p.unchanged for p in self._parts.values()),
            sum(p.tombstoned for p in self._parts.values()),
        )
        partitioned = names != [None] and (names is not None or bool(self._before))
        if not partitioned:
            whole = self._parts.get("")
            status, error = (
                self._failure
                if self._failure
                else (whole.status, whole.error)
                if whole
                else (TableStatus.SUCCEEDED, None)
            )
            return TableResult(status, *counts, error, total, total_estimated=total_estimated)
        latest: dict[str, TableResult] = {}
        for name in [n or "" for n in names or []] or list(self._before):
            found = self._parts.get(name) or self._before.get(name)
            done = name in slices and slices[name].done
            latest[name] = found or TableResult(
                TableStatus.SUCCEEDED if done else TableStatus.PENDING
            )
        failing = [(n, r) for n, r in latest.items() if r.error]
        if self._failure:
            status, error = self._failure
        else:
            status = table_status(latest) if latest else TableStatus.SUCCEEDED
            error = None
            if failing and status is not TableStatus.SUCCEEDED:
                error = failing[0][1].error
                if error is not None and status is TableStatus.PARTIAL:
                    gave_up = [n for n, r in latest.items() if r.status is TableStatus.FAILED]
                    error = error.with_message(
                        f"{len(gave_up)} of {len(latest)} partitions failed "
                        f"({', '.join(gave_up)}); first: {error.message}"
                    )
        return TableResult(
            status, *counts, error, total, dict(self._parts), total_estimated=total_estimated
        )


def slices_due(
    names: list[str],
    every: timedelta,
    last: CompletePasses,
    began: Mapping[str, SliceCheckpoint],
    now: datetime,
) -> set[str]:
    """The slices (partitions, '' for a table read whole) of an incremental table with a
    periodic complete pass that this run reads completely (pure): each whose own last complete
    pass is older than ``every``, or that never had one. So a partition that keeps failing is
    read completely again and again until it is (and is then tombstoned), while the others go
    back to their incremental reads after theirs. A slice an earlier attempt of the run began
    goes on as it began (``began``)."""
    due = set()
    for name in names:
        earlier = began.get(name)
        if earlier is not None:
            if earlier.resync:
                due.add(name)
            continue
        when = last.last(name)
        if when is None or now - when >= every:
            due.add(name)
    return due
