"""A first sync's batches are appended with COPY; a key stored already sends the batch, and the
rest of the table, back to the upsert, with nothing of the failed append kept."""

from __future__ import annotations

from typing import Any

import pytest

from connectors import Mode, Position, Table
from sync import Engine
from sync.base.abort import AbortSignal
from sync.errors import LeaseLost
from sync.runs.records import APPEND_FROM, RecordWriter
from sync.store import Lease, TableWrites
from tests.test_fencing import claim
from tests.test_sync_flow import items, new_dataset, sync_once, tombstoned

BATCH = APPEND_FROM + 50
TABLE = Table("items", "id", Mode.FULL)


class Appends:
    """What each append of the record writer returned, in order (the real append runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.results: list[bool] = []
        real = TableWrites.append_batch

        def counted(writes: TableWrites, *args: Any, **kwargs: Any) -> bool:
            appended = real(writes, *args, **kwargs)
            self.results.append(appended)
            return appended

        monkeypatch.setattr(TableWrites, "append_batch", counted)


def started(engine: Engine) -> tuple[int, Lease]:
    key, _ = new_dataset(items=[])
    workspace = engine.create_workspace("acme")
    connection = engine.create_connection(workspace.id, "mem", "memory", config={"dataset": key})
    engine.sync(connection.id)
    row = claim(engine, "worker-a")
    return connection.id, Lease(row["id"], row["lease_owner"])


def new_writer(db: Any, lease: Lease, connection_id: int) -> RecordWriter:
    return RecordWriter(db, lease, connection_id, TABLE, batch_size=BATCH, abort=AbortSignal())


# What COPY's text format must escape: a tab, a newline, a backslash, and text past ASCII.
AWKWARD = "tab\there\nnext line \\ back \\N é 😀"


def records(ids: range, version: str) -> list[dict[str, Any]]:
    return [{"id": i, "version": version, "note": AWKWARD} for i in ids]


def stored(admin: Any, connection_id: int) -> dict[str, Any]:
    rows = admin.execute(
        "SELECT external_id, data->>'version' AS version, written_by FROM records "
        "WHERE connection_id = %s",
        (connection_id,),
    ).fetchall()
    return {row["external_id"]: (row["version"], row["written_by"]) for row in rows}


def checkpoint(admin: Any, run_id: int) -> dict[str, Any]:
    row = admin.execute(
        "SELECT c.records, c.position, c.done, r.processed_units FROM run_checkpoints c "
        "JOIN connection_runs r ON r.id = c.run_id WHERE c.run_id = %s",
        (run_id,),
    ).fetchone()
    return dict(row)


def test_a_first_sync_is_appended_and_a_resync_upserted(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection_id, lease = started(engine)
    appends = Appends(monkeypatch)
    with engine.pool.connection() as db:
        writer = new_writer(db, lease, connection_id)
        writer.write(records(range(BATCH), "v1"))
        writer.write(Position({"page": 1}))
        writer.write(records(range(BATCH, BATCH + 10), "v1"))  # below APPEND_FROM: upserted
        writer.end()
        assert (writer.counts.upserted, writer.counts.unchanged) == (BATCH + 10, 0)

        assert appends.results == [True]
        rows = stored(admin, connection_id)
        assert len(rows) == BATCH + 10
        assert {written_by for _, written_by in rows.values()} == {lease.owner}
        notes = admin.execute("SELECT DISTINCT data->>'note' AS note FROM records").fetchall()
        assert notes == [{"note": AWKWARD}]
        assert checkpoint(admin, lease.id) == {
            "records": BATCH + 10,
            "position": {"page": 1},
            "done": True,
            "processed_units": BATCH + 10,
        }

        # The table holds rows now: the next read of it is upserted, unchanged rows skipped.
        again = new_writer(db, lease, connection_id)
        again.write(records(range(BATCH), "v1"))
        again.end()
        assert (again.counts.upserted, again.counts.unchanged) == (0, BATCH)
        assert appends.results == [True]


def test_an_append_meeting_a_stored_key_keeps_nothing_and_the_batch_is_upserted(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection_id, lease = started(engine)
    appends = Appends(monkeypatch)
    with engine.pool.connection() as db:
        writer = new_writer(db, lease, connection_id)
        writer.write(records(range(BATCH), "v1"))
        writer.write(Position({"page": 1}))
        # The provider's pages shifted: the second page repeats the first page's last record,
        # changed since.
        writer.write(records(range(BATCH - 1, 2 * BATCH - 1), "v2"))
        writer.write(Position({"page": 2}))
        writer.write(records(range(2 * BATCH - 1, 3 * BATCH - 1), "v2"))
        writer.end()

        assert appends.results == [True, False]  # and no append tried after the failed one
        rows = stored(admin, connection_id)
        assert len(rows) == 3 * BATCH - 1
        assert rows[str(BATCH - 1)][0] == "v2"
        assert sum(version == "v1" for version, _ in rows.values()) == BATCH - 1
        # The failed append's checkpoint went with its records: each batch counted once.
        assert checkpoint(admin, lease.id) == {
            "records": 3 * BATCH,
            "position": {"page": 2},
            "done": True,
            "processed_units": 3 * BATCH,
        }
        assert (writer.counts.upserted, writer.counts.unchanged) == (3 * BATCH, 0)


def test_an_append_under_a_lost_lease_writes_nothing(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection_id, lease = started(engine)
    appends = Appends(monkeypatch)
    admin.execute("UPDATE connection_runs SET lease_expires_at = now() - interval '1 second'")
    with engine.pool.connection() as db:
        writer = new_writer(db, lease, connection_id)
        writer.write(records(range(BATCH), "v1"))
        with pytest.raises(LeaseLost):
            writer.flush()
        writer.close()
    assert appends.results == []  # it raised
    assert stored(admin, connection_id) == {}
    assert admin.execute("SELECT count(*) AS n FROM run_checkpoints").fetchone()["n"] == 0


class Steps:
    """How many times the tombstone pass looked for unseen rows of table ``items`` (its first
    step rides in ``end_table``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        for name in ("end_table", "tombstone_step", "unseen_step", "seen_keys_intact"):
            real = getattr(TableWrites, name)

            def counted(writes: TableWrites, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                self.taken += writes._table_name == "items"
                return _real(writes, *args, **kwargs)

            monkeypatch.setattr(TableWrites, name, counted)


def test_a_table_first_written_by_the_attempt_ends_without_looking_for_unseen_rows(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, data = new_dataset(items=items(*range(1, BATCH + 1)))
    workspace = engine.create_workspace("acme")
    connection = engine.create_connection(workspace.id, "mem", "memory", config={"dataset": key})
    steps = Steps(monkeypatch)

    first = sync_once(engine, connection.id)
    assert first.status == "succeeded"
    assert (first.results["items"]["upserted"], first.results["items"]["tombstoned"]) == (BATCH, 0)
    assert steps.taken == 0
    # The complete pass is stamped all the same.
    state = admin.execute(
        "SELECT last_full_sync_at FROM table_state WHERE connection_id = %s AND table_name = %s",
        (connection.id, "items"),
    ).fetchone()
    assert state is not None and state["last_full_sync_at"] is not None

    # Stored rows now: the next complete read looks for the unseen ones, and finds one.
    data.tables["items"] = items(*range(2, BATCH + 1))
    second = sync_once(engine, connection.id)
    assert second.results["items"]["tombstoned"] == 1
    assert steps.taken > 0
    assert tombstoned(admin, connection.id) == {"1"}
