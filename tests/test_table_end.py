"""The end of a table's read and of a run, each in as few statements as its invariants allow:
``end_table`` (the seen-key check, the first tombstone step and the stamp of the complete pass in
one round trip) and the finish that writes the attempt's own counts itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sync import Engine
from sync.errors import LeaseLost
from sync.store import Lease, Seal, SliceSave, TableWrites

SETUP = """
INSERT INTO workspaces (name) VALUES ('ws');
INSERT INTO connections (workspace_id, name, provider, config) VALUES (1, 'c', 'memory', '{}');
"""


def _running_run(admin: Any) -> Lease:
    """A run of connection 1 held by a live lease, with its attempt's history row."""
    owner = uuid.uuid4()
    run_id = admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, started_at,"
        " attempts, lease_owner, lease_expires_at, worker_id)"
        " VALUES (1, 1, 'memory', 'running', now(), 1, %s, now() + interval '1 hour', 'w')"
        " RETURNING id",
        (owner,),
    ).fetchone()["id"]
    admin.execute(
        "INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id)"
        " VALUES (%s, 1, %s, 'w')",
        (run_id, owner),
    )
    return Lease(run_id, owner)


def _stored(admin: Any, keys: range, *, partition: str | None = None) -> None:
    """Rows an earlier run wrote: live, and not written by the run under test."""
    admin.execute(
        "INSERT INTO records (connection_id, table_name, external_id, data, content_hash,"
        " written_by, partition)"
        " SELECT 1, 'items', k::text, '{}', '\\x00', gen_random_uuid(), %s"
        " FROM unnest(%s::int[]) k",
        (partition, list(keys)),
    )


def _seen(admin: Any, lease: Lease, keys: list[str], *, saved: int | None = None) -> None:
    """Keys the run saw unchanged, and the count its (logged) checkpoint saved of them."""
    admin.execute(
        "INSERT INTO run_seen_keys (run_id, table_name, external_id)"
        " SELECT %s, 'items', k FROM unnest(%s::text[]) k",
        (lease.id, keys),
    )
    admin.execute(
        "INSERT INTO run_checkpoints (run_id, table_name, partition, done, resync, seen,"
        " first_attempt)"
        " SELECT %s, 'items', '', true, true, %s, a.id FROM run_attempts a WHERE a.run_id = %s",
        (lease.id, len(keys) if saved is None else saved, lease.id),
    )


def _live(admin: Any) -> list[str]:
    rows = admin.execute(
        "SELECT external_id FROM records WHERE deleted_at IS NULL ORDER BY external_id::int"
    ).fetchall()
    return [r["external_id"] for r in rows]


def _stamp(admin: Any) -> Any:
    row = admin.execute(
        "SELECT last_full_sync_at FROM table_state WHERE connection_id = 1 AND table_name = 'items'"
    ).fetchone()
    return row and row["last_full_sync_at"]


@pytest.fixture
def conn(engine: Engine) -> Iterator[Any]:
    """A connection of the engine's pool, as the record writer holds one."""
    with engine.pool.connection() as connection:
        yield connection


def test_a_table_that_fits_one_step_ends_in_one_call(admin: Any, conn: Any) -> None:
    admin.execute(SETUP)
    lease = _running_run(admin)
    _stored(admin, range(1, 6))
    _seen(admin, lease, ["1", "3"])
    end = TableWrites(conn, lease, 1, "items").end_table(None, whole=[], stamp=True, limit=100)
    assert end.intact and end.completed
    assert end.tombstoned == {"": 3}
    assert _live(admin) == ["1", "3"]
    assert _stamp(admin) is not None
    left = admin.execute("SELECT count(*) AS n FROM run_seen_keys").fetchone()["n"]
    assert left == 0  # the seen keys go with the pass's end


def test_lost_seen_keys_end_nothing(admin: Any, conn: Any) -> None:
    """Two keys saved by the checkpoints, one left (a crash restart of Postgres empties the
    unlogged table): nothing is tombstoned, nothing stamped, the run reads the table again."""
    admin.execute(SETUP)
    lease = _running_run(admin)
    _stored(admin, range(1, 6))
    _seen(admin, lease, ["1"], saved=2)
    end = TableWrites(conn, lease, 1, "items").end_table(None, whole=[], stamp=True, limit=100)
    assert not end.intact and not end.completed
    assert _live(admin) == ["1", "2", "3", "4", "5"]
    assert _stamp(admin) is None


def test_a_bigger_table_takes_more_steps_then_completes(admin: Any, conn: Any) -> None:
    admin.execute(SETUP)
    lease = _running_run(admin)
    _stored(admin, range(1, 8))
    _seen(admin, lease, ["1", "3", "5", "7"])
    writes = TableWrites(conn, lease, 1, "items")
    end = writes.end_table(None, whole=[], stamp=True, limit=2)
    assert end.intact and not end.completed
    assert (end.last_key, end.scanned) == ("2", 2)
    assert _stamp(admin) is None  # not before the last step
    step = writes.tombstone_step(None, end.last_key or "", 10)
    writes.complete_table(stamp=True, partitions=[])
    assert sum(end.tombstoned.values()) + sum(step.tombstoned.values()) == 3
    assert _live(admin) == ["1", "3", "5", "7"]
    assert _stamp(admin) is not None


def test_end_table_is_fenced(admin: Any, conn: Any) -> None:
    admin.execute(SETUP)
    lease = _running_run(admin)
    _stored(admin, range(1, 4))
    _seen(admin, lease, [])
    stale = Lease(lease.id, uuid.uuid4())
    with pytest.raises(LeaseLost):
        TableWrites(conn, stale, 1, "items").end_table(None, whole=[], stamp=True, limit=100)
    assert _live(admin) == ["1", "2", "3"]
    assert _stamp(admin) is None


def test_the_finish_writes_the_attempts_own_counts(engine: Engine, admin: Any) -> None:
    """The run keeps its totals over every attempt; the attempt's row keeps its own."""
    admin.execute(SETUP)
    lease = _running_run(admin)
    store = engine.store
    totals = {"items": {"upserted": 7}}
    own = {"items": {"upserted": 2}}
    assert store.finish(Seal(lease, "succeeded", totals, own, None))
    run = admin.execute("SELECT status, results FROM connection_runs").fetchone()
    attempt = admin.execute("SELECT outcome, results FROM run_attempts").fetchone()
    assert (run["status"], run["results"]) == ("succeeded", totals)
    assert (attempt["outcome"], attempt["results"]) == ("succeeded", own)


def test_no_statement_of_a_table_read_is_prepared_on_the_server(admin: Any, conn: Any) -> None:
    """A table grows under its own writes, so a plan cached while it held a few rows must not
    serve its millionth: a generic plan made then walked every stored row of the table to clear
    tombstone marks, once per batch (a first sync of 1 M records slowed to ~100 records/s where
    autovacuum is off). Planned per call, none of the table's statements is prepared, however
    many batches the connection writes."""
    admin.execute(SETUP)
    lease = _running_run(admin)
    writes = TableWrites(conn, lease, 1, "items")
    progress = {"progress": None, "total_units": None}
    for batch in range(12):  # more than psycopg's prepare threshold (5) of each statement
        keys = [f"{batch}-a", f"{batch}-b"]
        checkpoint = SliceSave(
            "", {"page": batch}, done=False, resync=True, pages=batch, total=None
        )
        writes.write_batch(
            keys,
            ["{}", "{}"],
            [b"\x01", b"\x02"],
            partition=None,
            track_seen=True,
            checkpoint=checkpoint,
            progress=progress,
        )
        writes.save_cursor({"page": batch}, None)
        assert writes.seen_keys_intact()
    prepared = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    assert [r["statement"] for r in prepared if "records" in r["statement"]] == []
    assert admin.execute("SELECT count(*) AS n FROM records").fetchone()["n"] == 24


def _heap_blocks_read(conn: Any, call: Any) -> tuple[Any, int]:
    """``call()``'s result and the heap blocks of ``records`` its transaction read."""
    with conn.transaction():
        result = call()
        row = conn.execute(
            "SELECT pg_stat_get_xact_blocks_fetched('records'::regclass) AS n"
        ).fetchone()
    return result, row["n"]


def test_writes_by_key_read_a_few_blocks_whatever_the_statistics_say(admin: Any, conn: Any) -> None:
    """The statistics of the records table were taken before a new connection's first sync
    (where autovacuum is off, or has not caught up), so the planner takes that connection's
    rows for a handful. Updating rows by an array of keys (a batch clearing the missed marks of
    its unchanged rows, deletions, a shifting listing's missing keys) then read every row of the
    connection's table: each batch of a first sync cost more than the one before. Probed key by
    key and updated by address, each reads a few heap blocks whatever the table holds."""
    admin.execute(SETUP)
    admin.execute("ALTER TABLE records SET (autovacuum_enabled = false)")
    admin.execute(  # another connection's rows, all the statistics know of
        "INSERT INTO records (connection_id, table_name, external_id, data, content_hash,"
        " written_by) SELECT 2, 'items', k::text, '{}', '\\x00', gen_random_uuid()"
        " FROM generate_series(1, 100) k"
    )
    admin.execute("ANALYZE records")
    admin.execute(
        "INSERT INTO records (connection_id, table_name, external_id, data, content_hash,"
        " written_by)"
        " SELECT 1, 'items', k::text, jsonb_build_object('pad', repeat('x', 400)), '\\x00',"
        " gen_random_uuid() FROM generate_series(1, 20000) k"
    )
    pages = admin.execute(
        "SELECT pg_relation_size('records') / current_setting('block_size')::int AS n"
    ).fetchone()["n"]
    assert pages > 1000
    lease = _running_run(admin)
    admin.execute(
        "UPDATE records SET missed_by = %s WHERE external_id IN ('7', '9')", (lease.id - 1,)
    )
    writes = TableWrites(conn, lease, 1, "items")
    checkpoint = SliceSave("", {"page": 1}, done=False, resync=True, pages=1, total=None)

    written, batch = _heap_blocks_read(
        conn,
        lambda: writes.write_batch(
            ["7", "new"],
            ["{}", "{}"],
            [b"\x00", b"\x01"],
            partition=None,
            track_seen=True,
            checkpoint=checkpoint,
            progress={"progress": None, "total_units": None},
        ),
    )
    tombstoned, deletions = _heap_blocks_read(conn, lambda: writes.tombstone_ids(["8", "gone"]))
    missing, listing = _heap_blocks_read(conn, lambda: writes.mark_missing(["9", "10"]))

    assert max(batch, deletions, listing) < 50, (batch, deletions, listing, pages)
    assert (written.upserted, written.unchanged) == (1, 1)
    assert tombstoned == {"": 1} and missing == {"": 1}
    rows = admin.execute(
        "SELECT external_id, missed_by IS NOT NULL AS missed, deleted_at IS NOT NULL AS deleted"
        " FROM records WHERE connection_id = 1 AND external_id IN ('7', '8', '9', '10')"
        " ORDER BY external_id::int"
    ).fetchall()
    assert [(r["external_id"], r["missed"], r["deleted"]) for r in rows] == [
        ("7", False, False),  # seen unchanged: its mark cleared
        ("8", False, True),  # reported deleted
        ("9", True, True),  # missed by two complete listings
        ("10", True, False),  # missed once: marked
    ]
