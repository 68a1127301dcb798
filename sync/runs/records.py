"""The record writer: turns what a table read yields into fenced, batched writes.

Per batch, one statement (``write_record_batch``) compares content hashes with the stored ones,
one index probe per key, and upserts only new, changed or revived rows; unchanged rows are never
sent to the upsert, so they cost no lock, no tuple version and no WAL. The same statement saves
the checkpoint of the slice being read (the table, or one partition of it): the last read
position the connector yielded, so a position never commits before the records it covers. When
positions come, a full batch waits for the next one (the end of the page it is in), so that it
commits with the position right after its last record and a resumed read repeats no page it
wrote. The tombstone pass is ``sync.runs.tombstones``.

A table the connection holds no row of yet (a first sync) skips the probes: its batches are
appended with ``COPY`` in one transaction with the checkpoint, fenced the same way. A key that
turns out to be stored already (a record read twice across pages that shifted) fails that
append whole; the batch, and every batch after it, is then upserted as above.
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
from typing import Any, Protocol

import orjson
import psycopg

from connectors.base import Checkpoint, Deleted, Mode, Position, Resync, Table, Total
from connectors.errors import PermanentError
from sync.base.abort import AbortSignal
from sync.runs.checkpoints import SliceCheckpoint
from sync.runs.progress import RunProgress
from sync.store import Lease, SliceSave, TableWrites

# With positions, a full batch waits for the end of its page, but never grows past this many
# batches' worth of records (a connector whose pages are larger than a batch).
MAX_BATCHES_BUFFERED = 2

# A batch of at least this many records, of a table the connection holds no row of yet (a first
# sync), is appended with COPY. A smaller one stays one upsert statement: the append is a
# transaction of four round trips, and the query that decides it one more. The bound is chosen,
# not measured: benchmarks write batches of 1,000.
APPEND_FROM = 200

_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


class RecordError(PermanentError):
    """A record the engine cannot store (no primary key, a value Postgres rejects)."""

    kind = "record"


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


def encode(
    record: Mapping[str, Any], table: str, key: str, ignores: Sequence[str] = ()
) -> tuple[str, bytes]:
    """The record as canonical JSON text (sorted keys, so equal records hash equal) and its
    16-byte content hash, taken without the ``ignores`` fields (dotted paths)."""
    raw = _canonical(record, table, key)
    if b"\\u0000" in raw and _NUL_ESCAPE.search(raw):
        raise RecordError(
            f"record {key!r} of table {table!r} contains a NUL character (\\u0000), which "
            "Postgres cannot store in jsonb"
        )
    hashed = _canonical(without(record, ignores), table, key) if ignores else raw
    return raw.decode(), hashlib.blake2b(hashed, digest_size=16).digest()


def _canonical(record: Mapping[str, Any], table: str, key: str) -> bytes:
    try:
        return orjson.dumps(
            record, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str
        )
    except TypeError as exc:  # orjson.JSONEncodeError included
        if "Integer exceeds 64-bit range" not in str(exc):
            raise RecordError(f"record {key!r} of table {table!r} is not JSON: {exc}") from None
        return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()


def without(record: Mapping[str, Any], paths: Sequence[str]) -> Mapping[str, Any]:
    """``record`` without the fields at ``paths`` (``"head.repo.pushed_at"``); only the
    mappings along a path are copied, the record itself is never changed (pure)."""
    trimmed: dict[str, Any] = dict(record)
    for path in paths:
        _drop(trimmed, path.split("."))
    return trimmed


def _drop(node: dict[str, Any], steps: list[str]) -> None:
    head, rest = steps[0], steps[1:]
    if not rest:
        node.pop(head, None)
        return
    child = node.get(head)
    if isinstance(child, Mapping):
        copy = dict(child)
        node[head] = copy
        _drop(copy, rest)


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


class Observer(Protocol):
    """Sees every record before it is written, and each batch before it is sent (the typed
    views of ``sync.runs.typed``)."""

    def observe(self, record: Mapping[str, Any]) -> None: ...

    def before_write(self) -> None: ...


@dataclass
class WriteCounts:
    upserted: int = 0
    unchanged: int = 0
    tombstoned: int = 0


class RecordWriter:
    """Buffers one table's items and writes them in fenced batches on ``conn``, one slice (the
    table, or one partition of it) at a time: ``begin()``, ``write()`` what the read yields,
    ``end()`` when the read is complete."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        lease: Lease,
        connection_id: int,
        table: Table,
        *,
        batch_size: int,
        abort: AbortSignal,
        progress: RunProgress | None = None,
        observer: Observer | None = None,
    ) -> None:
        self._writes = TableWrites(conn, lease, connection_id, table.name)
        self._observer = observer
        self._table = table
        self._batch_size = batch_size
        self._abort = abort
        self._progress = progress or RunProgress([table.name])
        self._records: dict[str, tuple[str, bytes]] = {}
        self._deletions: set[str] = set()
        self._in_flight = InFlight()
        # Whether new batches are appended (COPY) rather than upserted: unknown until the first
        # batch large enough, then while no append met a stored key. Touched only by the write
        # of a batch, which runs one at a time.
        self._appending: bool | None = None
        self._found_empty = False
        self.counts = WriteCounts()
        self.begin(None, None)

    def begin(self, partition: str | None, checkpoint: SliceCheckpoint | None) -> None:
        """Start a slice: the whole table (``partition`` None) or one partition, from where an
        earlier attempt of the run left it (``checkpoint``), if anywhere."""
        self._in_flight.wait()
        self._partition = partition
        self._position = checkpoint.position if checkpoint else None
        self._saved_position = self._position
        self._positioned = False
        self._pages = checkpoint.pages if checkpoint else 0
        self._total = checkpoint.total if checkpoint else None
        self._total_estimated = checkpoint.total_estimated if checkpoint else False
        # Records of the slice written by this run (earlier attempts too), for its exact size.
        self._slice_records = checkpoint.records if checkpoint else 0
        self._resumed = checkpoint is not None
        # Tombstone unseen rows at the end: always for a full table; for an incremental one
        # once the provider asked for a resync (in this attempt or an earlier one).
        self._full = self._table.mode is Mode.FULL or bool(checkpoint and checkpoint.resync)
        self.counts = WriteCounts()
        self._progress.begin_slice(partition, checkpoint)

    def forget(self, partition: str | None) -> None:
        """Forget how far an earlier attempt of the run read this slice (a whole table also
        forgets the keys it saw): it is read again from its start."""
        self._writes.reset_checkpoints(partition)

    def write(self, item: Any) -> None:
        """Take a record (a mapping), a :class:`Deleted`, a :class:`Checkpoint`, a
        :class:`Position`, a :class:`Total`, a :class:`Resync`, or a page of them."""
        if isinstance(item, Mapping):
            self._add_record(item)
        elif isinstance(item, Position):
            self._position = item.value
            self._positioned = True
            if len(self._records) >= self._batch_size:
                self.flush(background=True)
        elif isinstance(item, Total):
            self._total, self._total_estimated = int(item.count), item.estimate
            self._progress.slice_total(self._total, estimated=item.estimate)
        elif isinstance(item, Deleted):
            self._add_deletion(str(item.external_id))
        elif isinstance(item, Checkpoint):
            self.flush()
            self._save_cursor(item.cursor, item.partition)
        elif isinstance(item, Resync):
            self.flush()
            self._full = True
        elif isinstance(item, Sequence | Iterable) and not isinstance(item, str | bytes):
            self._pages += 1
            self._progress.page(self._pages)
            for inner in item:
                self.write(inner)
        else:
            raise RecordError(
                f"table {self._table.name!r} yielded a {type(item).__name__}; yield dicts, "
                "Deleted, Checkpoint, Position, Total, Resync or lists of them"
            )

    def _add_record(self, record: Mapping[str, Any]) -> None:
        key = external_id(record, self._table.primary_key, self._table.name)
        self._deletions.discard(key)
        if self._observer is not None:
            self._observer.observe(record)
        self._records[key] = encode(record, self._table.name, key, self._table.hash_ignores)
        buffered = len(self._records)
        if buffered >= self._batch_size and (
            # With positions, wait for the end of the page so the batch commits with the
            # position right after it.
            not self._positioned or buffered >= self._batch_size * MAX_BATCHES_BUFFERED
        ):
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

    def flush(
        self, *, check_abort: bool = True, background: bool = False, done: bool = False
    ) -> None:
        """Write the buffered deletions, then the buffered records with the slice's checkpoint.
        With ``background`` the records are written by a helper thread while the caller reads
        and encodes the next batch; without it, everything written before has been written when
        this returns, and a position that no batch carried yet is saved on its own. ``done``
        marks the slice read to its end."""
        if check_abort:
            self._abort.check()
        if self._deletions:
            # Deletions go first: a position must never commit before a deletion it covers.
            background = False
            self._in_flight.wait()
            gone = self._writes.tombstone_ids(sorted(self._deletions))
            self.counts.tombstoned += sum(gone.values())
            self._deletions.clear()
        if not background:
            self._in_flight.wait()
        if done and self._total_estimated:
            # Read to its end, the slice held what was read: its total is no longer a guess.
            self._total, self._total_estimated = self._slice_records + len(self._records), False
            self._progress.slice_total(self._total, estimated=False)
        checkpoint = self._checkpoint(done)
        if self._records:
            if self._observer is not None:
                # The views fit the batch before it commits: no reader meets a value its
                # column's type cannot show.
                self._observer.before_write()
            keys = list(self._records)
            self._slice_records += len(keys)
            datas = [self._records[k][0] for k in keys]
            hashes = [self._records[k][1] for k in keys]
            self._records.clear()
            self._progress.read(len(keys))
            write = partial(
                self._write_batch,
                keys,
                datas,
                hashes,
                track_seen=self._full,
                checkpoint=checkpoint,
                progress=self._progress.snapshot(),
            )
            self._saved_position = self._position
            if background:
                self._in_flight.submit(write)
            else:
                write()
        elif done and not self._resumed and self._slice_records == 0 and self._position is None:
            # A slice read empty from its start needs no checkpoint of its end: lost in a
            # crash, it costs a read of nothing again. The tombstone pass and the finish go by
            # what this attempt knows, and no earlier attempt's read of the slice counts (it
            # would have a checkpoint). One statement fewer for every empty table of a run.
            pass
        elif done or self._position != self._saved_position:
            self._saved_position = self._position
            self._writes.save_checkpoint(checkpoint, self._progress.snapshot())

    def end(self) -> None:
        """The slice was read to its end: write what is buffered and mark it done."""
        self.flush(done=True)

    @property
    def found_empty(self) -> bool:
        """Whether the table held no row when this writer first wrote to it: then every row it
        holds now was written by this attempt (the fence lets no other writer in), and a
        complete read of it left nothing unseen to tombstone."""
        return self._found_empty

    @property
    def resync(self) -> bool:
        """Whether this slice's read lists all of it, so that unseen rows are tombstoned."""
        return self._full

    def close(self) -> None:
        """Wait for a batch still being written and stop the helper thread. Call it before the
        connection goes back to the pool, also after a failure: the batch's own failure is
        dropped then, since the caller is already handling one."""
        self._in_flight.close()

    def _checkpoint(self, done: bool) -> SliceSave:
        return SliceSave(
            slice=self._partition or "",
            position=self._position,
            done=done,
            resync=self._full,
            pages=self._pages,
            total=self._total,
            total_estimated=self._total_estimated,
        )

    def _write_batch(
        self,
        keys: list[str],
        datas: list[str],
        hashes: list[bytes],
        *,
        track_seen: bool,
        checkpoint: SliceSave,
        progress: dict[str, Any],
    ) -> None:
        if self._appending is None and len(keys) >= APPEND_FROM:
            self._appending = self._found_empty = not self._writes.records_stored()
        if self._appending and len(keys) >= APPEND_FROM:
            if self._writes.append_batch(
                keys,
                datas,
                hashes,
                partition=self._partition,
                checkpoint=checkpoint,
                progress=progress,
            ):
                self.counts.upserted += len(keys)
                return
            # A key read before (pages that shifted between reads): upserted from now on.
            self._appending = False
        written = self._writes.write_batch(
            keys,
            datas,
            hashes,
            partition=self._partition,
            track_seen=track_seen,
            checkpoint=checkpoint,
            progress=progress,
        )
        self.counts.upserted += written.upserted
        self.counts.unchanged += written.unchanged

    def _save_cursor(self, cursor: Any, partition: str | None) -> None:
        self._abort.check()
        self._writes.save_cursor(cursor, partition)
