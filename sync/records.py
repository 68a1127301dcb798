"""The record writer: turns what a table read yields into fenced, batched writes.

Per batch, one statement (``write_record_batch``) compares content hashes with the stored ones,
one index probe per key, and upserts only new, changed or revived rows; unchanged rows are never
sent to the upsert, so they cost no lock, no tuple version and no WAL. A ``full`` table read
completely ends with ``tombstone_unseen`` steps, which tombstone the rows this attempt did not
see.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from connectors.base import Checkpoint, Deleted, Mode, Resync, Table
from connectors.errors import PermanentError
from sync.abort import AbortSignal
from sync.db import is_transient
from sync.errors import LeaseLost
from sync.queries import QUERIES

TRANSIENT_RETRIES = 5
TOMBSTONE_STEP = 10_000  # stored rows per step of the tombstone pass

_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


class RecordError(PermanentError):
    """A record the engine cannot store (no primary key, a value Postgres rejects)."""

    kind = "record"


@dataclass(frozen=True)
class Lease:
    """The claim a run's writes are fenced by."""

    run_id: int
    lease_owner: Any  # uuid.UUID


def external_id(record: Mapping[str, Any], primary_key: str | tuple[str, ...], table: str) -> str:
    """The row's key as text: the field's value, or a JSON array of a composite key's values."""
    names = (primary_key,) if isinstance(primary_key, str) else primary_key
    values = []
    for name in names:
        value = record.get(name)
        if value is None or value == "":
            raise RecordError(f"a record of table {table!r} has no primary key field {name!r}")
        values.append(value)
    if len(values) == 1:
        return str(values[0])
    return json.dumps(values, separators=(",", ":"), default=str)


def encode(record: Mapping[str, Any], table: str, key: str) -> tuple[str, bytes]:
    """The record as canonical JSON text (sorted keys, so equal records hash equal) and its
    16-byte content hash."""
    try:
        raw = orjson.dumps(
            record, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str
        )
    except TypeError as exc:  # orjson.JSONEncodeError included
        if "Integer exceeds 64-bit range" not in str(exc):
            raise RecordError(f"record {key!r} of table {table!r} is not JSON: {exc}") from None
        raw = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()
    if b"\\u0000" in raw and _NUL_ESCAPE.search(raw):
        raise RecordError(
            f"record {key!r} of table {table!r} contains a NUL character (\\u0000), which "
            "Postgres cannot store in jsonb"
        )
    return raw.decode(), hashlib.blake2b(raw, digest_size=16).digest()


class InFlight:
    """At most one write at a time in a helper thread, so that reading and encoding the next
    batch overlaps the database writing the last one (the worker and its backend each keep a
    core busy instead of taking turns). Writes run in the order submitted, each after the one
    before has committed; ``submit`` and ``wait`` raise the failure of the write before."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[None] | None = None

    def submit(self, write: Callable[[], None]) -> None:
        self.wait()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="record-writer")
        self._future = self._executor.submit(write)

    def wait(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self) -> None:
        try:
            # Its failure is dropped: the caller is already handling one of its own.
            with contextlib.suppress(Exception):
                self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


@dataclass
class WriteCounts:
    upserted: int = 0
    unchanged: int = 0
    tombstoned: int = 0


class RecordWriter:
    """Buffers one table's items and writes them in fenced batches on ``conn``."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        lease: Lease,
        connection_id: int,
        table: Table,
        *,
        batch_size: int,
        abort: AbortSignal,
    ) -> None:
        self._conn = conn
        self._lease = lease
        self._connection_id = connection_id
        self._table = table
        self._batch_size = batch_size
        self._abort = abort
        self._records: dict[str, tuple[str, bytes]] = {}
        self._deletions: set[str] = set()
        # Tombstone unseen rows at the end: always for a full table; for an incremental one
        # once the provider asked for a resync.
        self._full = table.mode is Mode.FULL
        self._seen_keys = 0  # keys this table put in run_seen_keys, to clear when it completes
        self._in_flight = InFlight()
        self.counts = WriteCounts()

    def write(self, item: Any) -> None:
        """Take a record (a mapping), a :class:`Deleted`, a :class:`Checkpoint` or a page of
        them."""
        if isinstance(item, Mapping):
            self._add_record(item)
        elif isinstance(item, Deleted):
            self._add_deletion(str(item.external_id))
        elif isinstance(item, Checkpoint):
            self.flush()
            self._save_cursor(item.cursor)
        elif isinstance(item, Resync):
            self.flush()
            self._full = True
        elif isinstance(item, Sequence | Iterable) and not isinstance(item, str | bytes):
            for inner in item:
                self.write(inner)
        else:
            raise RecordError(
                f"table {self._table.name!r} yielded a {type(item).__name__}; yield dicts, "
                "Deleted, Checkpoint or lists of them"
            )

    def _add_record(self, record: Mapping[str, Any]) -> None:
        key = external_id(record, self._table.primary_key, self._table.name)
        self._deletions.discard(key)
        self._records[key] = encode(record, self._table.name, key)
        if len(self._records) >= self._batch_size:
            self.flush(background=True)

    def _add_deletion(self, key: str) -> None:
        if self._table.mode is not Mode.INCREMENTAL:
            raise RecordError(
                f"table {self._table.name!r} is a full table; deletions are found by the engine "
                "and only incremental tables report them"
            )
        self._records.pop(key, None)
        self._deletions.add(key)
        if len(self._deletions) >= self._batch_size:
            self.flush()

    def flush(self, *, check_abort: bool = True, background: bool = False) -> None:
        """Write the buffered records, then the buffered deletions. With ``background`` the
        records are written by a helper thread while the caller reads and encodes the next
        batch; without it, everything written before has been written when this returns."""
        if check_abort:
            self._abort.check()
        if not background:
            self._in_flight.wait()
        if self._records:
            keys = list(self._records)
            datas = [self._records[k][0] for k in keys]
            hashes = [self._records[k][1] for k in keys]
            self._records.clear()
            write = partial(self._write_batch, keys, datas, hashes, track_seen=self._full)
            if background:
                self._in_flight.submit(write)
            else:
                write()
        if self._deletions:
            self._in_flight.wait()
            row = self._one(QUERIES.tombstone_ids, external_ids=sorted(self._deletions))
            self.counts.tombstoned += row["tombstoned"]
            self._deletions.clear()

    def close(self) -> None:
        """Wait for a batch still being written and stop the helper thread. Call it before the
        connection goes back to the pool, also after a failure: the batch's own failure is
        dropped then, since the caller is already handling one."""
        self._in_flight.close()

    def _write_batch(
        self, keys: list[str], datas: list[str], hashes: list[bytes], *, track_seen: bool
    ) -> None:
        row = self._one(
            QUERIES.write_record_batch,
            external_ids=keys,
            datas=datas,
            hashes=hashes,
            track_seen=track_seen,
        )
        self.counts.upserted += row["upserted"]
        self.counts.unchanged += row["unchanged"]
        self._seen_keys += row["seen"]

    def complete(self) -> None:
        """The table was read to its end: flush, and for a ``full`` table tombstone the rows
        this attempt did not see, in bounded steps (each its own short fenced statement)."""
        self.flush()
        if not self._full:
            return
        after = ""
        while True:
            self._abort.check()
            row = self._one(QUERIES.tombstone_unseen, after=after, limit=TOMBSTONE_STEP)
            self.counts.tombstoned += row["tombstoned"]
            if row["scanned"] < TOMBSTONE_STEP:
                break
            after = row["last_key"]
        if self._seen_keys:
            self._conn.execute(
                QUERIES.clear_table_seen_keys,
                {"lease_owner": self._lease.lease_owner, "table_name": self._table.name},
            )

    def _save_cursor(self, cursor: Any) -> None:
        self._abort.check()
        found = self._conn.execute(
            QUERIES.save_cursor, {**self._params(), "cursor": Jsonb(cursor)}
        ).fetchone()
        if not found:
            raise LeaseLost()

    def _one(self, query: Any, **params: Any) -> dict[str, Any]:
        # Each statement is its own transaction, so a deadlock or lock timeout is repeated
        # as it is rather than failing the table.
        for attempt in Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(TRANSIENT_RETRIES),
            wait=wait_random_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        ):
            with attempt:
                row: dict[str, Any] | None = self._conn.execute(
                    query, {**self._params(), **params}
                ).fetchone()
        if not row or not row["fenced"]:
            raise LeaseLost()
        return row

    def _params(self) -> dict[str, Any]:
        return {
            "run_id": self._lease.run_id,
            "lease_owner": self._lease.lease_owner,
            "connection_id": self._connection_id,
            "table_name": self._table.name,
        }
