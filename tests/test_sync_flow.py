"""A run's life on the real Postgres: claimed, executed, records published, tombstones, revival,
partial failure, incremental cursors."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest

import connectors
from connectors import Mode, PermanentError, RetryableError, Table, register
from sync import Engine
from sync.store import TableWrites
from tests.conftest import make_settings
from tests.fakes import DATASETS, Dataset, MemoryPagesConnector


def items(*ids: int, version: str = "v1") -> list[dict[str, Any]]:
    return [{"id": i, "title": f"item {i}", "version": version} for i in ids]


def new_dataset(**tables: list[dict[str, Any]]) -> tuple[str, Dataset]:
    key = uuid.uuid4().hex
    DATASETS[key] = Dataset(tables=dict(tables))
    return key, DATASETS[key]


def live(
    admin: psycopg.Connection[Any], connection_id: int, table: str = "items"
) -> dict[str, Any]:
    rows = admin.execute(
        "SELECT external_id, data FROM records WHERE connection_id = %s AND table_name = %s "
        "AND deleted_at IS NULL",
        (connection_id, table),
    ).fetchall()
    return {r["external_id"]: r["data"] for r in rows}


def tombstoned(admin: psycopg.Connection[Any], connection_id: int) -> set[str]:
    rows = admin.execute(
        "SELECT external_id FROM records WHERE connection_id = %s AND deleted_at IS NOT NULL",
        (connection_id,),
    ).fetchall()
    return {r["external_id"] for r in rows}


def sync_once(engine: Engine, connection_id: int) -> Any:
    run = engine.sync(connection_id)
    worker = engine.worker(listen=False)
    assert worker.poll() is True
    return engine.run(run.id)


def test_a_sync_publishes_records_then_tombstones_and_revives(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(1, 2, 3), notes=[{"owner": "a", "n": 1, "text": "x"}])
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})

    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"
    assert run.attempts == 1
    assert run.results["items"] == {
        "status": "succeeded",
        "upserted": 3,
        "unchanged": 0,
        "tombstoned": 0,
        "error": None,
    }
    assert set(live(admin, conn.id)) == {"1", "2", "3"}
    assert set(live(admin, conn.id, "notes")) == {'["a",1]'}
    attempts = engine.attempts(run.id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "succeeded")]

    # Upstream: 2 vanished, 3 changed, 4 is new.
    data.tables["items"] = items(1) + items(3, version="v2") + items(4)
    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"
    assert run.results["items"]["upserted"] == 2
    assert run.results["items"]["unchanged"] == 1
    assert run.results["items"]["tombstoned"] == 1
    assert set(live(admin, conn.id)) == {"1", "3", "4"}
    assert live(admin, conn.id)["3"]["version"] == "v2"
    assert tombstoned(admin, conn.id) == {"2"}

    # 2 comes back: live again, counted as upserted.
    data.tables["items"] = items(1, 2) + items(3, version="v2") + items(4)
    run = sync_once(engine, conn.id)
    assert run.results["items"]["upserted"] == 1
    assert run.results["items"]["tombstoned"] == 0
    assert tombstoned(admin, conn.id) == set()
    # Seen keys are scratch space: nothing is left behind.
    assert admin.execute("SELECT count(*) AS n FROM run_seen_keys").fetchone()["n"] == 0


def test_an_empty_table_ends_without_a_checkpoint_and_still_tombstones(
    engine: Engine, admin: Any
) -> None:
    """A table read empty from its start saves no checkpoint of its end (one statement fewer
    per empty table); its tombstone pass and the stamp of its complete pass still run."""
    key, data = new_dataset(items=items(1, 2), notes=[])
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    first = sync_once(engine, conn.id)
    data.tables["items"] = []
    second = sync_once(engine, conn.id)

    assert (first.status, second.status) == ("succeeded", "succeeded")
    assert second.results["items"]["tombstoned"] == 2
    assert tombstoned(admin, conn.id) == {"1", "2"}
    saved = admin.execute(
        "SELECT run_id, table_name FROM run_checkpoints WHERE run_id IN (%s, %s)",
        (first.id, second.id),
    ).fetchall()
    assert [(r["run_id"], r["table_name"]) for r in saved] == [(first.id, "items")]
    stamps = admin.execute(
        "SELECT table_name FROM table_state WHERE connection_id = %s"
        " AND last_full_sync_at >= %s ORDER BY table_name",
        (conn.id, second.started_at),
    ).fetchall()
    assert [r["table_name"] for r in stamps] == ["items", "notes"]


def test_missing_keys_past_the_confirmation_bound_wait_for_a_second_listing(
    engine: Engine, admin: Any
) -> None:
    asked: list[set[str]] = []

    class Confirming(MemoryPagesConnector):
        """A shifting listing whose provider confirms two missing items per run."""

        provider = "memory_confirming"
        tables = (Table("items", "id", Mode.FULL, shifting=True, confirm_limit=2),)

        def confirm_deleted(
            self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
        ) -> list[str]:
            asked.append(set(missing))
            return list(missing)  # each item asked about is gone

    register(Confirming)
    try:
        key, data = new_dataset(items=items(*range(1, 11)))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "c", "memory_confirming", config={"dataset": key})
        assert sync_once(engine, conn.id).status == "succeeded"

        data.tables["items"] = items(*range(1, 6))  # 6 to 10 deleted upstream
        run = sync_once(engine, conn.id)
        assert run.status == "succeeded", run.error
        # Two are confirmed and tombstoned; the other three were only missing from one listing.
        (first,) = asked
        assert len(first) == 2 and tombstoned(admin, conn.id) == first
        assert run.results["items"]["tombstoned"] == 2
        assert len(live(admin, conn.id)) == 8

        # A second complete listing misses them too: tombstoned, confirmed or not.
        run = sync_once(engine, conn.id)
        assert run.results["items"]["tombstoned"] == 3
        assert tombstoned(admin, conn.id) == {str(n) for n in range(6, 11)}
    finally:
        connectors.registry.unregister("memory_confirming")


def test_an_unchanged_row_is_not_rewritten(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    sync_once(engine, conn.id)
    before = {
        r["external_id"]: r["ctid"]
        for r in admin.execute("SELECT external_id, ctid::text FROM records").fetchall()
    }
    data.tables["items"] = items(1) + items(2, version="v2")
    run = sync_once(engine, conn.id)
    assert run.results["items"]["unchanged"] == 1
    after = {
        r["external_id"]: r["ctid"]
        for r in admin.execute("SELECT external_id, ctid::text FROM records").fetchall()
    }
    assert after["1"] == before["1"]  # same tuple: never rewritten
    assert after["2"] != before["2"]


def test_a_table_failing_part_way_tombstones_nothing(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(1, 2, 3, 4))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key, "page_size": 1})
    sync_once(engine, conn.id)

    # Upstream now has only 1 and 2, and the read breaks after the first row.
    data.tables["items"] = items(1, 2)
    data.failures["items"] = (1, PermanentError("page 2 is malformed"))
    run = sync_once(engine, conn.id)
    assert run.status == "partial"  # notes succeeded, items failed for good
    assert run.results["items"]["status"] == "failed"
    assert run.results["items"]["error"]["message"] == "page 2 is malformed"
    assert run.results["items"]["tombstoned"] == 0
    assert tombstoned(admin, conn.id) == set()
    assert set(live(admin, conn.id)) == {"1", "2", "3", "4"}
    assert run.results["notes"]["status"] == "succeeded"


def test_incremental_table_saves_its_cursor_and_tombstones_reported_deletions(
    engine: Engine, admin: Any
) -> None:
    events = [{"id": f"e{i}", "seq": i} for i in range(1, 6)]
    key, data = new_dataset(events=events)
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "ev", "memory_events", config={"dataset": key})
    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"
    assert run.results["events"]["upserted"] == 5
    cursor = admin.execute(
        "SELECT cursor FROM table_state WHERE connection_id = %s", (conn.id,)
    ).fetchone()
    assert cursor["cursor"] == {"seq": 5}

    # Next sync starts from the cursor: only new events are read; a reported deletion applies;
    # rows the connector did not mention are left alone (incremental tables never anti-join).
    data.tables["events"] = [*events, {"id": "e6", "seq": 6}]
    data.deletions["events"] = ["e2"]
    run = sync_once(engine, conn.id)
    assert run.results["events"]["upserted"] == 1
    assert run.results["events"]["tombstoned"] == 1
    assert tombstoned(admin, conn.id) == {"e2"}
    assert set(live(admin, conn.id, "events")) == {"e1", "e3", "e4", "e5", "e6"}


def test_cursor_is_saved_only_after_the_batch_it_covers(engine: Engine, admin: Any) -> None:
    events = [{"id": f"e{i}", "seq": i} for i in range(1, 6)]
    key, data = new_dataset(events=events)
    data.failures["events"] = (3, RetryableError("connection reset"))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "ev", "memory_events", config={"dataset": key})
    run = sync_once(engine, conn.id)
    assert run.status == "queued"  # retry pending
    cursor = admin.execute("SELECT cursor FROM table_state").fetchone()["cursor"]
    assert cursor == {"seq": 3}
    assert set(live(admin, conn.id, "events")) == {"e1", "e2", "e3"}


# Every cursor saved is checked, in the saving transaction, against the committed records: a
# cursor must never be saved before the batch it covers has committed.
CURSOR_AUDIT = """
CREATE TABLE cursor_audit (seq int, missing bigint);
CREATE FUNCTION audit_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.cursor ? 'seq' THEN
        INSERT INTO cursor_audit
        SELECT (NEW.cursor->>'seq')::int, count(*)
          FROM generate_series(1, (NEW.cursor->>'seq')::int) g
         WHERE NOT EXISTS (SELECT 1 FROM records r
                            WHERE r.connection_id = NEW.connection_id
                              AND r.table_name = NEW.table_name AND r.external_id = 'e' || g);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_cursor BEFORE INSERT OR UPDATE ON table_state
    FOR EACH ROW EXECUTE FUNCTION audit_cursor();
"""


def test_batches_written_in_the_background_all_land_in_order(schema: str, admin: Any) -> None:
    """With one record a batch, every batch is written by the helper thread while the next
    one is read; the counts, the tombstone pass and the cursors must not notice."""
    with Engine(make_settings(schema, batch_size=1)) as engine:
        engine.migrate()
        admin.execute(CURSOR_AUDIT)
        ws = engine.create_workspace("acme")
        key, data = new_dataset(items=items(*range(1, 26)))
        conn = engine.create_connection(
            ws.id, "mem", "memory", config={"dataset": key, "page_size": 3}
        )
        run = sync_once(engine, conn.id)
        assert run.results["items"]["upserted"] == 25
        assert set(live(admin, conn.id)) == {str(i) for i in range(1, 26)}

        data.tables["items"] = items(*range(1, 21)) + items(21, 22, 23, version="v2")
        run = sync_once(engine, conn.id)
        assert run.results["items"] == {
            "status": "succeeded",
            "upserted": 3,
            "unchanged": 20,
            "tombstoned": 2,
            "error": None,
        }
        assert tombstoned(admin, conn.id) == {"24", "25"}

        # An incremental table: a checkpoint after every row, each waiting for the batch
        # written in the background before it; the read breaks after the seventh row.
        events = [{"id": f"e{i}", "seq": i} for i in range(1, 11)]
        key, data = new_dataset(events=events)
        data.failures["events"] = (7, RetryableError("connection reset"))
        ev = engine.create_connection(ws.id, "ev", "memory_events", config={"dataset": key})
        run = sync_once(engine, ev.id)
        assert run.status == "queued"
        # (An upsert fires the insert and the update trigger: one save may be audited twice.)
        audit = admin.execute(
            "SELECT DISTINCT seq, missing FROM cursor_audit ORDER BY seq"
        ).fetchall()
        assert [(a["seq"], a["missing"]) for a in audit] == [(i, 0) for i in range(1, 8)]
        assert set(live(admin, ev.id, "events")) == {f"e{i}" for i in range(1, 8)}


# The same audit for read positions: every position saved is checked, at the end of the
# statement that saves it, against the records it covers (the pages before it). A position must
# never commit before its batch.
def test_a_position_is_never_saved_before_the_records_it_covers(schema: str, admin: Any) -> None:
    """Batches of one record, all written in the background, on pages of three: each position
    rides with the batch that ends its page, and the records before it are there."""
    size = 3
    with Engine(make_settings(schema, batch_size=1)) as engine:
        engine.migrate()
        admin.execute("CREATE TABLE position_audit (page int, missing bigint)")
        admin.execute(
            "CREATE FUNCTION audit_position_of_run() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "DECLARE c bigint; BEGIN "
            "SELECT connection_id INTO c FROM connection_runs WHERE id = NEW.run_id; "
            "IF NEW.position ? 'page' THEN INSERT INTO position_audit "
            "SELECT (NEW.position->>'page')::int, count(*) FROM generate_series(1, "
            f"((NEW.position->>'page')::int - 1) * {size}) g WHERE NOT EXISTS (SELECT 1 FROM "
            "records r WHERE r.connection_id = c AND r.table_name = NEW.table_name "
            "AND r.external_id = g::text); END IF; RETURN NEW; END $$"
        )
        admin.execute(
            "CREATE TRIGGER audit_position AFTER INSERT OR UPDATE ON run_checkpoints "
            "FOR EACH ROW EXECUTE FUNCTION audit_position_of_run()"
        )
        key, data = new_dataset(items=items(*range(1, 31)))
        data.failures["items"] = (22, RetryableError("connection reset"))  # on page 8
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(
            ws.id, "pages", "memory_pages", config={"dataset": key, "page_size": size}
        )
        run = sync_once(engine, conn.id)
        assert run.status == "queued"
        audit = admin.execute(
            "SELECT DISTINCT page, missing FROM position_audit ORDER BY page"
        ).fetchall()
        assert [(a["page"], a["missing"]) for a in audit] == [(p, 0) for p in range(2, 9)]
        assert set(live(admin, conn.id)) == {str(i) for i in range(1, 22)}


def test_a_row_one_listing_missed_and_the_next_saw_is_not_rewritten(
    engine: Engine, admin: Any
) -> None:
    class Shifting(MemoryPagesConnector):
        """A shifting listing with no per-item read: two listings must miss a key."""

        provider = "memory_shifting"
        tables = (Table("items", "id", Mode.FULL, shifting=True),)

    register(Shifting)
    try:
        key, data = new_dataset(items=items(1, 2, 3))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "s", "memory_shifting", config={"dataset": key})
        assert sync_once(engine, conn.id).status == "succeeded"

        def row(external_id: str) -> dict[str, Any]:
            found: dict[str, Any] = admin.execute(
                "SELECT updated_at, missed_by, ctid::text FROM records "
                "WHERE connection_id = %s AND external_id = %s",
                (conn.id, external_id),
            ).fetchone()
            return found

        data.tables["items"] = items(1, 2)  # 3 shifted out of this listing
        missed = sync_once(engine, conn.id)
        assert row("3")["missed_by"] == missed.id
        before = row("3")

        data.tables["items"] = items(1, 2, 3)  # the next listing sees 3 again, unchanged
        run = sync_once(engine, conn.id)
        assert run.results["items"]["upserted"] == 0
        assert run.results["items"]["unchanged"] == 3
        after = row("3")
        assert after["missed_by"] is None  # the mark is cleared...
        assert after["updated_at"] == before["updated_at"]  # ...without rewriting the row

        # The mark is gone: one more listing that misses 3 marks it again, it is not tombstoned.
        data.tables["items"] = items(1, 2)
        run = sync_once(engine, conn.id)
        assert run.results["items"]["tombstoned"] == 0
        assert tombstoned(admin, conn.id) == set()
    finally:
        connectors.registry.unregister("memory_shifting")


def test_the_tombstone_pass_steps_by_the_setting(
    schema: str, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tombstone_step`` bounds each fenced step of the pass: seven stored rows, two a step,
    take four steps, and the pass still tombstones exactly what went."""
    steps: list[tuple[str, int]] = []
    step, end = TableWrites.tombstone_step, TableWrites.end_table

    def counted(self: TableWrites, partitions: Any, after: str, limit: int) -> Any:
        taken = step(self, partitions, after, limit)
        steps.append((after, taken.scanned))
        return taken

    def counted_end(self: TableWrites, partitions: Any, **kwargs: Any) -> Any:
        taken = end(self, partitions, **kwargs)  # the first step rides on the table's end
        steps.append(("", taken.scanned))
        return taken

    monkeypatch.setattr(TableWrites, "tombstone_step", counted)
    monkeypatch.setattr(TableWrites, "end_table", counted_end)
    with Engine(make_settings(schema, tombstone_step=2)) as engine:
        engine.migrate()
        ws = engine.create_workspace("acme")
        key, data = new_dataset(items=items(*range(1, 8)))
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        sync_once(engine, conn.id)
        steps.clear()
        data.tables["items"] = items(1, 3, 5, 7)
        run = sync_once(engine, conn.id)
    assert run.results["items"]["tombstoned"] == 3
    assert tombstoned(admin, conn.id) == {"2", "4", "6"}
    # The items table's steps (the empty notes table takes one of its own).
    assert [s for s in steps if s != ("", 0)] == [("", 2), ("2", 2), ("4", 2), ("6", 1)]
