"""Ingestions of local files on the real Postgres: a shorter version leaves no chunk past its
tail, a cancel stops within one batch, a shutdown hands the ingestion back without spending an
attempt, a stale lease writes nothing, failures are retried with the engine's backoff or fail
for good in one clear line, and search sees only ready documents of its own workspace."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from connectors import RateLimited, RetryableError
from sync import Engine
from sync.base.abort import AbortReason
from sync.documents import HashingEmbedder
from sync.errors import Conflict, InvalidInput, LeaseLost, NotFound
from sync.ingestions.decisions import FAILED, after_failure
from sync.ingestions.kind import read_ingestion_control
from sync.ingestions.models import IngestionStatus
from sync.ingestions.store import IngestionStore
from sync.jobs.outcome import Action, Outcome
from sync.store.queries import parse
from sync.store.sqlfiles import sql_dir
from sync.vocabulary import ErrorKind, JobError
from tests.conftest import make_settings
from tests.ingestion_support import (
    CountingEmbedder,
    chunk_count,
    drain,
    stored_chunks,
    worker_with,
    write_text,
)
from tests.test_queries import _PLACEHOLDER as PLACEHOLDER


@pytest.fixture
def small_batches(schema: str) -> Any:
    """An engine whose ingestions write batches of 20 chunks."""
    with Engine(make_settings(schema, ingestion_batch_size=20), pool_size=6) as engine:
        engine.migrate()
        yield engine


def test_a_shorter_version_leaves_no_chunk_past_its_tail(
    engine: Engine, admin: Any, tmp_path: Path
) -> None:
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "spec.txt", paragraphs=300, seed=1)
    long = chunk_count(path)
    worker = worker_with(engine)
    try:
        first = engine.ingest(path, ws.id)
        drain(worker)
        assert engine.ingestion(first.id).total_units == long

        write_text(path, paragraphs=120, seed=2)  # a new, shorter version
        short = chunk_count(path)
        assert short < long
        second = engine.ingest(path, ws.id)
        assert second.id != first.id
        drain(worker)
        done = engine.ingestion(second.id)
        assert done.status == "ready" and done.document_id == engine.ingestion(first.id).document_id
        assert done.results["tail_deleted"] == long - short

        other = engine.create_workspace("fresh")
        fresh = engine.ingest(path, other.id)
        drain(worker)
    finally:
        worker.close()
    stored = stored_chunks(admin, done.document_id or 0)
    assert [r[0] for r in stored] == list(range(short))  # nothing past the tail
    assert stored == stored_chunks(admin, engine.ingestion(fresh.id).document_id or 0)


def test_a_cancel_mid_document_stops_within_one_batch(
    small_batches: Engine, admin: Any, tmp_path: Path
) -> None:
    engine = small_batches
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "long.txt", paragraphs=120)
    total = chunk_count(path)
    ingestion = engine.ingest(path, ws.id)

    # While it embeds its fourth batch, someone cancels it.
    def cancel_at(batch: int) -> None:
        if batch == 4:
            assert engine.cancel_ingestion(ingestion.id).status == "running"

    counting = CountingEmbedder(before=cancel_at)
    worker = worker_with(engine, counting)
    try:
        assert worker.poll()
    finally:
        worker.close()
    done = engine.ingestion(ingestion.id)
    assert done.status == "cancelled" and done.error == {
        "kind": "cancelled",
        "message": "a cancel was requested",
    }
    assert len(counting.batches) == 4 and total > 4 * 20
    # The batch being embedded when the cancel came was not written: three batches stand.
    assert done.processed_units == 60
    assert len(stored_chunks(admin, done.document_id or 0)) == 60
    # A cancelled document is not searchable.
    assert list(engine.search("steel beam", ws.id)) == []


def test_a_shutdown_hands_it_back_without_spending_an_attempt(
    small_batches: Engine, tmp_path: Path
) -> None:
    engine = small_batches
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "long.txt", paragraphs=120)
    ingestion = engine.ingest(path, ws.id)
    worker = worker_with(engine)
    worker.slot("ingestion").kind.embedder = CountingEmbedder(
        before=lambda n: n == 3 and worker.stop()
    )
    try:
        assert worker.poll()
    finally:
        worker.close()
    back = engine.ingestion(ingestion.id)
    assert back.status == "queued" and back.attempts == 0 and back.lease_owner is None
    # The batch embedded when the stop came is written, then it stops: three batches stand, and
    # the next attempt resumes there.
    assert back.processed_units == 60

    again = worker_with(engine, CountingEmbedder())
    try:
        drain(again)
    finally:
        again.close()
    done = engine.ingestion(ingestion.id)
    assert done.status == "ready" and done.attempts == 1
    resumed = again.slot("ingestion").kind.embedder
    assert isinstance(resumed, CountingEmbedder)
    assert resumed.embedded == (done.total_units or 0) - 60


def lose_last_batch(admin: Any, ingestion_id: int) -> None:
    """What a Postgres crash does to a batch committed without waiting for its WAL flush: its
    checkpoint and its chunks are gone, while the worker that wrote it goes on."""
    row = admin.execute(
        "UPDATE ingestions SET processed_units = processed_units - 20 WHERE id = %s "
        "RETURNING processed_units, document_id",
        (ingestion_id,),
    ).fetchone()
    admin.execute(
        "DELETE FROM document_chunks WHERE document_id = %s AND chunk_index >= %s",
        (row["document_id"], row["processed_units"]),
    )


def resume_after_the_crash(engine: Engine, admin: Any, ingestion_id: int) -> Any:
    requeued = engine.ingestion(ingestion_id)
    assert requeued.status == "queued" and requeued.error is not None
    assert "the database lost the last batches" in requeued.error["message"]
    admin.execute("UPDATE ingestions SET queued_at = now() WHERE id = %s", (ingestion_id,))
    worker = worker_with(engine)
    try:
        drain(worker)
    finally:
        worker.close()
    return engine.ingestion(ingestion_id)


def test_a_batch_a_crash_lost_is_written_again_before_the_document_is_ready(
    small_batches: Engine, admin: Any, tmp_path: Path
) -> None:
    engine = small_batches
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "long.txt", paragraphs=120)
    total = chunk_count(path)
    ingestion = engine.ingest(path, ws.id)

    # Three batches are written; the third one's commit is lost to a crash before the fourth.
    def crash_at(batch: int) -> None:
        if batch == 4:
            lose_last_batch(admin, ingestion.id)

    worker = worker_with(engine, CountingEmbedder(before=crash_at))
    try:
        assert worker.poll()
    finally:
        worker.close()
    done = resume_after_the_crash(engine, admin, ingestion.id)
    assert done.status == "ready" and total > 80
    assert [r[0] for r in stored_chunks(admin, done.document_id or 0)] == list(range(total))


def test_a_last_batch_a_crash_lost_keeps_the_document_from_being_ready(
    small_batches: Engine, admin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = small_batches
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "long.txt", paragraphs=120)
    total = chunk_count(path)
    ingestion = engine.ingest(path, ws.id)
    worker = worker_with(engine)
    store = worker.slot("ingestion").kind.store
    delete_tail = store.delete_tail

    # Every batch is written; the last one's commit is lost to a crash before the finish.
    def crash_first(*args: Any) -> int:
        lose_last_batch(admin, ingestion.id)
        return delete_tail(*args)

    monkeypatch.setattr(store, "delete_tail", crash_first)
    try:
        assert worker.poll()
    finally:
        worker.close()
    done = resume_after_the_crash(engine, admin, ingestion.id)
    assert done.status == "ready"
    assert [r[0] for r in stored_chunks(admin, done.document_id or 0)] == list(range(total))


def test_an_attempt_with_another_model_starts_again_at_chunk_0(
    small_batches: Engine, admin: Any, tmp_path: Path
) -> None:
    engine = small_batches
    ws = engine.create_workspace("docs")
    ingestion = engine.ingest(write_text(tmp_path / "long.txt", paragraphs=120), ws.id)
    worker = worker_with(engine)
    worker.slot("ingestion").kind.embedder = CountingEmbedder(
        before=lambda n: n == 3 and worker.stop()
    )
    try:
        assert worker.poll()
    finally:
        worker.close()
    assert engine.ingestion(ingestion.id).processed_units == 60  # three batches of 20

    # The next worker embeds with another model: the 60 chunks stored are not its own, so it
    # embeds every chunk, and the document holds one model only.
    other = CountingEmbedder(inner=HashingEmbedder(64))
    again = worker_with(engine, other)
    try:
        drain(again)
    finally:
        again.close()
    done = engine.ingestion(ingestion.id)
    assert done.status == "ready" and other.embedded == done.total_units
    assert done.indexed_with is not None and done.indexed_with.startswith("hashing-v1-64/")
    models = {row[3] for row in stored_chunks(admin, done.document_id or 0)}
    assert models == {"hashing-v1-64"}


def test_a_batch_renews_the_lease_and_never_revives_an_expired_one(
    engine: Engine, admin: Any, tmp_path: Path
) -> None:
    ws = engine.create_workspace("docs")
    engine.ingest(write_text(tmp_path / "a.txt", paragraphs=10), ws.id)
    store = IngestionStore(engine.pool)
    row = store.claim_document("worker-a", timedelta(seconds=120), None)
    assert row is not None
    begun = store.begin(
        row.lease, name="a.txt", media_type="text/plain", scope="local:/",
        content_sha256="00", indexed_with="x", total_units=10, results={},
    )  # fmt: skip
    assert begun is not None

    def batch(from_units: int, processed_units: int) -> bool:
        return store.write_batch(
            row.lease, document_id=begun.document_id, chunks=[], vectors=[], model="x",
            from_units=from_units, processed_units=processed_units,
            length=timedelta(seconds=600),
        )  # fmt: skip

    admin.execute("UPDATE ingestions SET lease_expires_at = now() + interval '5 seconds'")
    assert batch(0, 5) is False
    left = admin.execute("SELECT lease_expires_at - now() AS left FROM ingestions").fetchone()
    assert timedelta(seconds=590) <= left["left"] <= timedelta(seconds=600)

    admin.execute("UPDATE ingestions SET lease_expires_at = now() - interval '1 second'")
    with pytest.raises(LeaseLost):
        batch(5, 10)
    after = admin.execute(
        "SELECT processed_units, lease_expires_at < now() AS expired FROM ingestions"
    ).fetchone()
    assert after == {"processed_units": 5, "expired": True}


def test_a_value_the_database_refuses_fails_the_ingestion_at_once(
    engine: Engine, admin: Any, tmp_path: Path
) -> None:
    # A constraint the chunks break on every attempt (a check violation, SQLSTATE 23514).
    admin.execute(
        "ALTER TABLE document_chunks ADD CONSTRAINT no_forbidden "
        "CHECK (position('forbidden' in text) = 0)"
    )
    ws = engine.create_workspace("docs")
    path = tmp_path / "a.txt"
    path.write_text("This paragraph holds a forbidden word.\n")
    ingestion = engine.ingest(path, ws.id)
    worker = worker_with(engine)
    try:
        assert worker.poll()
    finally:
        worker.close()
    failed = engine.ingestion(ingestion.id)
    assert failed.status == "failed" and failed.attempts == 1
    assert failed.error is not None and failed.error["kind"] == "record"
    assert failed.error["message"].startswith(
        'Postgres rejected a value: new row for relation "document_chunks" violates check '
        'constraint "no_forbidden"'
    )


def test_a_stale_claim_writes_nothing(engine: Engine, admin: Any, tmp_path: Path) -> None:
    ws = engine.create_workspace("docs")
    ingestion = engine.ingest(write_text(tmp_path / "a.txt", paragraphs=10), ws.id)
    store = IngestionStore(engine.pool)
    row = store.claim_document("worker-a", timedelta(seconds=120), None)
    assert row is not None and row.id == ingestion.id
    stale = row.lease
    begun = store.begin(
        stale, name="a.txt", media_type="text/plain", scope="local:/",
        content_sha256="00", indexed_with="x", total_units=5, results={},
    )  # fmt: skip
    assert begun is not None and begun.processed_units == 0
    admin.execute("UPDATE ingestions SET lease_expires_at = now() - interval '1 second'")
    with engine.pool.connection() as conn:
        assert not IngestionStore.renew(conn, stale, timedelta(seconds=120))
        assert read_ingestion_control(conn, stale).stop is AbortReason.LEASE_LOST
    again = store.claim_document("worker-b", timedelta(seconds=120), None)
    assert again is not None and again.lease_owner != stale.owner
    assert again.attempts == 2
    with pytest.raises(LeaseLost):
        store.write_batch(
            stale, document_id=begun.document_id, chunks=[], vectors=[], model="x",
            from_units=0, processed_units=5, length=timedelta(seconds=120),
        )  # fmt: skip
    with pytest.raises(LeaseLost):
        store.delete_tail(stale, begun.document_id, 0)
    finished = store.finish(
        stale, document_id=begun.document_id, record_hash=None, name="a.txt",
        scope="local:/", version=None, content_sha256="00", source_hash=b"\0",
        indexed_with="x", total_units=5, results={},
    )  # fmt: skip
    assert (finished.fenced, finished.finished) == (False, False)
    error = JobError(ErrorKind.INTERNAL, "y")
    assert not store.end(stale, IngestionStatus.FAILED, error=error)
    assert store.requeue(stale, 1.0, error, spend_attempt=True) is None
    assert not store.hand_back(stale)
    assert not store.hand_over_to_archive(stale, name="a.zip", scope=None)
    now = engine.ingestion(ingestion.id)
    assert now.status == "running" and now.lease_owner == again.lease_owner
    assert now.processed_units == 0
    doc = admin.execute("SELECT status FROM documents WHERE id = %s", (begun.document_id,))
    assert doc.fetchone()["status"] == "indexing"


def test_a_retryable_failure_is_retried_with_backoff_then_fails_after_its_attempts(
    engine: Engine, tmp_path: Path
) -> None:
    ws = engine.create_workspace("docs")
    ingestion = engine.ingest(write_text(tmp_path / "a.txt", paragraphs=10), ws.id)

    def flaky(batch: int) -> None:
        raise RetryableError("the embeddings endpoint answered 503")

    worker = worker_with(engine, CountingEmbedder(before=flaky))
    try:
        for attempt in range(1, 4):
            before = datetime.now(UTC)
            assert worker.poll()
            ended = engine.ingestion(ingestion.id)
            if attempt < 3:
                assert ended.status == "queued" and ended.attempts == attempt
                delay = (ended.queued_at - before).total_seconds()
                base = engine.settings.backoff_seconds[attempt - 1]
                assert base * 0.8 - 1 <= delay <= base * 1.2 + 1
                assert ended.error == {
                    "kind": "retryable",
                    "message": "the embeddings endpoint answered 503",
                }
                with engine.pool.connection() as conn:  # the test is the clock
                    conn.execute("UPDATE ingestions SET queued_at = now()")
        assert ended.status == "failed"
        assert ended.error is not None and ended.error["message"] == (
            "gave up after 3 attempt(s): the embeddings endpoint answered 503"
        )
    finally:
        worker.close()


def test_a_bad_file_fails_in_one_line_and_the_worker_keeps_serving(
    engine: Engine, tmp_path: Path
) -> None:
    ws = engine.create_workspace("docs")
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8\xff\xe0 not a document")
    gone = write_text(tmp_path / "gone.txt", paragraphs=3)
    refused = engine.ingest(photo, ws.id)
    missing = engine.ingest(gone, ws.id)
    gone.unlink()  # the worker cannot read it any more
    fine = engine.ingest(write_text(tmp_path / "fine.txt", paragraphs=5), ws.id)
    worker = worker_with(engine)
    try:
        drain(worker)
    finally:
        worker.close()
    bad = engine.ingestion(refused.id)
    assert (bad.status, bad.attempts) == ("failed", 1)
    assert bad.error == {
        "kind": "document",
        "message": "photo.jpg is image/jpeg, which cannot be indexed; supported: text, "
        "Markdown, HTML and PDF",
    }
    lost = engine.ingestion(missing.id)
    assert lost.status == "failed" and lost.error is not None
    assert lost.error["message"].startswith(f"{gone} cannot be read on this worker's machine")
    assert "\n" not in lost.error["message"]
    assert engine.ingestion(fine.id).status == "ready"


def test_an_unchanged_local_file_is_not_embedded_again(engine: Engine, tmp_path: Path) -> None:
    ws = engine.create_workspace("docs")
    path = write_text(tmp_path / "a.txt", paragraphs=40)
    counting = CountingEmbedder()
    worker = worker_with(engine, counting)
    try:
        first = engine.ingest(path, ws.id)
        assert engine.ingest(path, ws.id).id == first.id  # still queued: the same one
        drain(worker)
        embedded = counting.embedded
        second = engine.ingest(path, ws.id)
        drain(worker)
    finally:
        worker.close()
    done = engine.ingestion(second.id)
    assert done.status == "ready" and done.results.get("reused") is True
    assert counting.embedded == embedded  # nothing embedded the second time


def test_search_sees_ready_documents_of_its_own_workspace_only(
    engine: Engine, tmp_path: Path
) -> None:
    mine, theirs = engine.create_workspace("mine"), engine.create_workspace("theirs")
    spec = tmp_path / "spec.md"
    spec.write_text("# Fire doors\n\nEvery fire door frame carries its rating label.\n")
    other = tmp_path / "other.md"
    other.write_text("# Fire doors\n\nThe other workspace's fire door schedule.\n")
    ours = engine.ingest(spec, mine.id)
    engine.ingest(other, theirs.id)
    worker = worker_with(engine)
    try:
        drain(worker)
    finally:
        worker.close()
    hits = engine.search("fire door rating", mine.id, limit=5)
    assert [h.document_name for h in hits] == ["spec.md"]
    assert hits[0].page == 1 and hits[0].local_path == str(spec) and hits[0].score > 0
    assert "rating label" in hits[0].text
    assert engine.scoped(theirs.id).search("door schedule")[0].document_name == "other.md"
    with pytest.raises(NotFound):
        engine.scoped(theirs.id).ingestion(ours.id)
    with pytest.raises(InvalidInput, match="the query is empty"):
        engine.search("   ", mine.id)
    with pytest.raises(Conflict, match="has already ended"):
        engine.cancel_ingestion(ours.id)


def test_what_is_decided_after_a_failure() -> None:
    def after(exc: Exception, attempts: int) -> Outcome:
        return after_failure(exc, abort=None, attempts=attempts, max_attempts=3, rand=lambda: 0.5)

    retry = after(RetryableError("503"), 1)
    assert (retry.action, retry.delay) == (Action.REQUEUE, 5.0)
    last = after(RetryableError("503"), 3)
    assert last.status == FAILED and last.error is not None
    assert last.error.message.startswith("gave up after 3")
    limited = after(RateLimited("429", retry_after=40.0), 3)
    assert (limited.action, limited.delay) == (Action.WAIT, 40.0)  # no attempt spent
    db = after(psycopg.OperationalError("gone"), 1)
    assert db.action is Action.REQUEUE and db.error is not None
    assert db.error.kind is ErrorKind.DATABASE and os.linesep not in db.error.message


def test_every_ingestion_statement_says_what_it_protects_and_prepares(
    engine: Engine, admin: Any
) -> None:
    named = parse((sql_dir() / "ingestions.sql").read_text())
    assert len(named) > 20
    for name, query in named.items():
        assert len(query.doc) > 40, f"{name} says nothing of what it protects"
        params = sorted(set(PLACEHOLDER.findall(query.text)))
        numbered = PLACEHOLDER.sub(lambda m, p=params: f"${p.index(m.group(1)) + 1}", query.text)
        admin.execute(f"PREPARE check_{name} AS {numbered}")
        admin.execute(f"DEALLOCATE check_{name}")
