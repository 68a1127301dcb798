"""The fenced statements of one table's read, on the connection the record writer holds: a
batch of records with its slice's checkpoint, a checkpoint alone, deletions, a cursor, the
steps of the tombstone pass and the end of the table. Each raises
:class:`~sync.errors.LeaseLost` when its fence matched nothing, and is repeated after a
transient failure (each statement is its own transaction, so a deadlock or a lock timeout is
repeated as it is rather than failing the table).

None of them is prepared on the server: the table they write grows under them, from nothing to
millions of rows within one read, and a generic plan made while it held a few rows is kept
until the next ANALYZE (never, where autovacuum is off). Planned per call, each batch is planned
for the table as it is, for a small fraction of what writing the batch takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from sync.errors import LeaseLost
from sync.store.db import Connection
from sync.store.queries import QUERIES
from sync.store.retry import DEFAULT, RetryPolicy
from sync.store.rows import BatchWritten, Lease, TableEnd, TombstoneStep, UnseenStep


@dataclass(frozen=True)
class SliceSave:
    """A slice's checkpoint as a write saves it: its read position, whether it is done and read
    whole (``resync``), pages read and the provider's total (an estimate or not)."""

    slice: str  # the partition, '' for a table read whole
    position: Any
    done: bool
    resync: bool
    pages: int
    total: int | None
    total_estimated: bool = False

    def params(self) -> dict[str, Any]:
        return {
            "slice": self.slice,
            "position": None if self.position is None else Jsonb(self.position),
            "done": self.done,
            "resync": self.resync,
            "pages": self.pages,
            "total": self.total,
            "total_estimated": self.total_estimated,
        }


class TableWrites:
    """The fenced statements of one table of one run, on ``conn``."""

    def __init__(
        self,
        conn: Connection,
        lease: Lease,
        connection_id: int,
        table_name: str,
        *,
        retry: RetryPolicy = DEFAULT,
    ) -> None:
        self._conn = conn
        self._lease = lease
        self._connection_id = connection_id
        self._table_name = table_name
        self._retry = retry

    def _fenced(self, query: sql.SQL, **params: Any) -> dict[str, Any]:
        full = {
            "run_id": self._lease.id,
            "lease_owner": self._lease.owner,
            "connection_id": self._connection_id,
            "table_name": self._table_name,
            **params,
        }
        row: dict[str, Any] | None = self._retry.run(
            lambda: self._conn.execute(query, full, prepare=False).fetchone()
        )
        if not row or not row["fenced"]:
            raise LeaseLost()
        return row

    def write_batch(
        self,
        external_ids: list[str],
        datas: list[str],
        hashes: list[bytes],
        *,
        partition: str | None,
        track_seen: bool,
        checkpoint: SliceSave,
        progress: Mapping[str, Any],
    ) -> BatchWritten:
        row = self._fenced(
            QUERIES.write_record_batch,
            external_ids=external_ids,
            datas=datas,
            hashes=hashes,
            track_seen=track_seen,
            partition=partition,
            **checkpoint.params(),
            **progress,
        )
        return BatchWritten(row["upserted"], row["unchanged"], row["seen"])

    def records_stored(self) -> bool:
        """Whether the connection holds any row of the table (tombstones included)."""
        row = self._conn.execute(
            QUERIES.records_stored,
            {"connection_id": self._connection_id, "table_name": self._table_name},
            prepare=False,
        ).fetchone()
        return row is None or bool(row["stored"])

    def append_batch(
        self,
        external_ids: list[str],
        datas: list[str],
        hashes: list[bytes],
        *,
        partition: str | None,
        checkpoint: SliceSave,
        progress: Mapping[str, Any],
    ) -> bool:
        """Append a batch of rows the table does not hold yet with ``COPY``, in one transaction
        with the slice's checkpoint. False, with nothing written, when one of the keys is stored
        already (the caller writes the batch with :meth:`write_batch` then)."""
        owner = self._lease.owner
        params = {
            "run_id": self._lease.id,
            "lease_owner": owner,
            "table_name": self._table_name,
            "count": len(external_ids),
            **checkpoint.params(),
            **progress,
        }

        def append() -> bool:
            try:
                with self._conn.transaction():
                    opened = self._conn.execute(
                        QUERIES.open_record_append, params, prepare=False
                    ).fetchone()
                    if not opened or not opened["fenced"]:
                        raise LeaseLost()
                    with self._conn.cursor() as cur, cur.copy(QUERIES.append_records) as copy:
                        for key, data, digest in zip(external_ids, datas, hashes, strict=True):
                            copy.write_row(
                                (self._connection_id, self._table_name, key, data, digest, owner,
                                 partition)
                            )  # fmt: skip
            except psycopg.errors.UniqueViolation:
                return False
            return True

        return self._retry.run(append)

    def save_checkpoint(self, checkpoint: SliceSave, progress: Mapping[str, Any]) -> None:
        self._fenced(QUERIES.save_checkpoint, **checkpoint.params(), **progress)

    def reset_checkpoints(self, partition: str | None) -> None:
        """Forget how far this run read the table (or one partition of it)."""
        self._fenced(QUERIES.reset_table_checkpoints, partition=partition)

    def tombstone_ids(self, external_ids: list[str]) -> dict[str, int]:
        """Tombstone rows known deleted upstream; how many per partition."""
        tombstoned: dict[str, int] = self._fenced(QUERIES.tombstone_ids, external_ids=external_ids)[
            "tombstoned"
        ]
        return tombstoned

    def mark_missing(self, external_ids: list[str]) -> dict[str, int]:
        """Rows a second complete listing missed are tombstoned (how many per partition); the
        others are marked missed by this run."""
        tombstoned: dict[str, int] = self._fenced(QUERIES.mark_missing, external_ids=external_ids)[
            "tombstoned"
        ]
        return tombstoned

    def save_cursor(self, cursor: Any, partition: str | None) -> None:
        """An incremental table's cursor (one partition's, when named). Not repeated: it rides
        after its batch and a failure fails the table."""
        found = self._conn.execute(
            QUERIES.save_cursor,
            {
                "run_id": self._lease.id,
                "lease_owner": self._lease.owner,
                "connection_id": self._connection_id,
                "table_name": self._table_name,
                "cursor": Jsonb(cursor),
                "partition": partition,
            },
            prepare=False,
        ).fetchone()
        if not found:
            raise LeaseLost()

    def tombstone_step(self, partitions: list[str] | None, after: str, limit: int) -> TombstoneStep:
        row = self._fenced(
            QUERIES.tombstone_unseen, partitions=partitions, after=after, limit=limit
        )
        return TombstoneStep.from_row(row)

    def unseen_step(self, partitions: list[str] | None, after: str, limit: int) -> UnseenStep:
        row = self._fenced(QUERIES.unseen_rows, partitions=partitions, after=after, limit=limit)
        return UnseenStep.from_row(row)

    def tombstone_partitions_step(
        self, partitions: list[str], after: str, limit: int
    ) -> TombstoneStep:
        """One bounded step tombstoning the live rows of partitions that are gone."""
        row = self._fenced(
            QUERIES.tombstone_partitions, partitions=partitions, after=after, limit=limit
        )
        return TombstoneStep.from_row(row)

    def partitions(self) -> tuple[list[str], dict[str, int]]:
        """The table's partitions as the last sync listed them, and those that answered 404
        since which run."""
        row = self._conn.execute(
            QUERIES.table_partitions,
            {"connection_id": self._connection_id, "table_name": self._table_name},
            prepare=False,
        ).fetchone()
        return (list(row["partitions"]), dict(row["absent"])) if row else ([], {})

    def save_partitions(
        self, listed: list[str], absent: Mapping[str, int], gone: list[str]
    ) -> None:
        """This run's listing of the table's partitions and the 404s since which run; the
        ``gone`` partitions lose their cursors and complete passes."""
        self._fenced(QUERIES.save_partitions, listed=listed, absent=Jsonb(dict(absent)), gone=gone)

    def end_table(
        self, partitions: list[str] | None, *, whole: list[str], stamp: bool, limit: int
    ) -> TableEnd:
        """The end of a table read completely, in one round trip when its rows fit in one step:
        the seen-key check, the first tombstone step over ``partitions`` (None: the whole
        table) and, once that step reached the end, :meth:`complete_table`."""
        row = self._fenced(
            QUERIES.end_table, partitions=partitions, whole=whole, stamp=stamp, limit=limit
        )
        return TableEnd.from_row(row)

    def complete_table(self, *, stamp: bool, partitions: list[str]) -> None:
        """The end of the tombstone pass: stamp the complete pass of each partition read whole
        (and of the table when ``stamp``: every partition was), drop the seen keys."""
        self._fenced(QUERIES.complete_table, stamp=stamp, partitions=partitions)

    def seen_keys_intact(self) -> bool:
        """Whether every seen key this run saved for the table is still there (a crash restart
        of Postgres empties the unlogged run_seen_keys)."""
        row = self._conn.execute(
            QUERIES.check_seen_keys,
            {"run_id": self._lease.id, "table_name": self._table_name},
            prepare=False,
        ).fetchone()
        return row is not None and bool(row["intact"])
