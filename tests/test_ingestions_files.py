"""Synced files become ingestions, and archives are expanded safely: the end of a files table
queues new and changed files (by content hash) and not unchanged ones, a tombstoned file's
document and chunks are deleted, a file that moves while it is indexed is marked ready under
its new scope only, a ZIP is expanded into member files that are each ingested, and zip bombs,
paths that escape, deep nesting and encrypted members are refused in one line while the worker
goes on serving."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.simulated.documents import kind_of
from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.documents import DocumentLimits
from sync.ingestions.models import IngestionStatus
from sync.ingestions.rows import Expanded, Member
from sync.ingestions.store import IngestionStore
from sync.testing import run_sync
from tests.conftest import make_settings
from tests.documents_fixtures import zip_bytes
from tests.ingestion_support import (
    CountingEmbedder,
    drain,
    without_ingestions,
    worker_with,
    write_text,
)


@pytest.fixture
def simulation() -> Simulation:
    simulation = Simulation()
    simulation.add_tenant("acme", size=120, seed=7)  # 12 files: txt, md, html, pdf, zip
    return simulation


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def documents(engine: Engine, server: str) -> tuple[int, int]:
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id,
        "documents",
        "simulated_docs",
        config={"base_url": server, "tenant": "acme", "page_size": 5},
        credentials={"token": "sim-acme"},
    )
    return ws.id, conn.id


def by_file(engine: Engine, ws: int) -> dict[str, list[Any]]:
    """The ingestions of each synced file (its archive members apart), oldest first."""
    found: dict[str, list[Any]] = {}
    for i in sorted(engine.ingestions(workspace_id=ws, limit=1000), key=lambda i: i.id):
        if not i.member_path:
            found.setdefault(str(i.external_id), []).append(i)
    return found


def test_synced_files_are_ingested_changed_ones_again_and_deleted_ones_dropped(
    engine: Engine, admin: Any, server: str, simulation: Simulation
) -> None:
    ws, conn = documents(engine, server)
    worker = worker_with(engine)
    try:
        assert run_sync(engine, conn, worker=worker).status == "succeeded"
        drain(worker)
        first = by_file(engine, ws)
        assert len(first) == 12 and all(len(v) == 1 for v in first.values())
        for external_id, (ingestion,) in first.items():
            assert ingestion.status == "ready", (external_id, ingestion.error)
            expected = "archive" if kind_of(int(external_id)) == "zip" else "document"
            assert ingestion.kind == expected
        archives = [i for (i,) in first.values() if i.kind == "archive"]
        for archive in archives:
            members = engine.ingestions(archive_id=archive.id)
            assert len(members) == 3 and all(m.status == "ready" for m in members)
            assert archive.results["members"] == 3
        hits = engine.search("submittal shop drawings", ws, limit=50)
        assert any(h.member_path == f"submittals/{archives[0].external_id}-shop-drawings.md"
                   for h in hits)  # fmt: skip

        # Upstream: files change, move, are added and deleted; the next sync queues those.
        changes = simulation.tenant("acme").advance()["files"]
        touched = {str(i) for k in ("updated", "moved", "added") for i in changes[k]}
        gone = {str(i) for i in changes["deleted"]}
        gone_docs = admin.execute(
            "SELECT id FROM documents WHERE external_id = ANY(%s)", (list(gone),)
        ).fetchall()
        assert gone_docs
        assert run_sync(engine, conn, worker=worker).status == "succeeded"
        drain(worker)
    finally:
        worker.close()
    second = by_file(engine, ws)
    again = {key for key, runs in second.items() if len(runs) > len(first.get(key, []))}
    assert again == touched  # the unchanged ones were not queued again
    assert all(runs[-1].status == "ready" for runs in second.values())
    left = admin.execute(
        "SELECT count(*) AS n FROM document_chunks WHERE document_id = ANY(%s)",
        ([r["id"] for r in gone_docs],),
    ).fetchone()
    assert left["n"] == 0
    assert not admin.execute(
        "SELECT 1 FROM documents WHERE external_id = ANY(%s)", (list(gone),)
    ).fetchall()
    for moved in changes["moved"]:
        scope = admin.execute(
            "SELECT scope FROM documents WHERE external_id = %s AND member_path = ''",
            (str(moved),),
        ).fetchone()["scope"]
        project = simulation.tenant("acme").row("files", moved)
        assert project is not None and scope == f"project:{project['project_id']}"


def test_reindex_embeds_synced_files_and_archive_members_with_the_model_now_configured(
    engine: Engine, admin: Any, server: str
) -> None:
    ws, conn = documents(engine, server)
    worker = worker_with(engine)
    try:
        assert run_sync(engine, conn, worker=worker).status == "succeeded"
        drain(worker)
    finally:
        worker.close()
    ready = admin.execute(
        "SELECT count(*) AS n, count(DISTINCT source_key) AS files FROM documents "
        "WHERE status = 'ready'"
    ).fetchone()
    assert ready["n"] > ready["files"]  # archive members share their archive's file

    engine.settings.embeddings_dimensions = 64  # another model: hashing-v1-64
    before = engine.search("submittal shop drawings", ws, limit=5)
    assert before.notice is not None and "hashing-v1-256, not the configured hashing-v1-64" in (
        before.notice
    )
    assert engine.reindex(ws) == ready["files"]  # one per file; an archive's members with it
    assert engine.reindex(ws) == 0  # already queued
    again = worker_with(engine)
    try:
        drain(again)
    finally:
        again.close()
    models = admin.execute(
        "SELECT DISTINCT c.embedding_model FROM document_chunks c "
        "JOIN documents d ON d.id = c.document_id WHERE d.status = 'ready'"
    ).fetchall()
    assert [m["embedding_model"] for m in models] == ["hashing-v1-64"]
    assert admin.execute(
        "SELECT count(*) AS n FROM documents WHERE status = 'ready'"
    ).fetchone() == {"n": ready["n"]}
    after = engine.search("submittal shop drawings", ws, limit=5)
    assert after.notice is None and len(after) == 5
    assert engine.reindex(ws) == 0


def test_a_file_that_moves_while_indexed_is_not_ready_under_its_old_scope(
    schema: str, admin: Any, server: str, simulation: Simulation
) -> None:
    # Which document the next generation moves (the same seed makes the same changes).
    twin = Simulation().add_tenant("acme", size=120, seed=7)
    moved = [i for i in twin.advance()["files"]["moved"] if kind_of(i) != "zip"]
    assert moved, "the seed moves no document"
    target = str(moved[0])
    with Engine(make_settings(schema, ingestion_batch_size=1), pool_size=8) as engine:
        engine.migrate()
        ws, conn = documents(engine, server)
        syncer = without_ingestions(engine.worker(listen=False))
        assert run_sync(engine, conn, worker=syncer).status == "succeeded"
        for external_id, (ingestion,) in by_file(engine, ws).items():
            if external_id != target:
                engine.cancel_ingestion(ingestion.id)
        (ingestion,) = by_file(engine, ws)[target]
        old_scope = f"project:{simulation.tenant('acme').row('files', int(target))['project_id']}"  # type: ignore[index]

        def move_at(batch: int) -> None:
            if batch == 2:  # mid-document, the file moves and a sync sees it
                simulation.tenant("acme").advance()
                assert run_sync(engine, conn, worker=syncer).status == "succeeded"

        indexer = worker_with(engine, CountingEmbedder(before=move_at))
        indexer.slot("ingestion").kind.limits = DocumentLimits(chunk_chars=300, chunk_overlap=50)
        try:
            assert indexer.poll()
        finally:
            indexer.close()
            syncer.close()
        done = engine.ingestion(ingestion.id)
        assert done.status == "ready", done.error
        assert (done.total_units or 0) >= 3
        row = simulation.tenant("acme").row("files", int(target))
        assert row is not None
        new_scope = f"project:{row['project_id']}"
        assert new_scope != old_scope
        document = admin.execute(
            "SELECT status, scope FROM documents WHERE id = %s", (done.document_id,)
        ).fetchone()
        assert (document["status"], document["scope"]) == ("ready", new_scope)
        assert done.scope == new_scope


@pytest.mark.parametrize(
    ("members", "options", "message"),
    [
        pytest.param(
            [("zeros.bin", bytes(20 * 1024 * 1024))],
            {},
            "upload.zip: zeros.bin expands more than 100 times its compressed size (a zip "
            "bomb?); raise CONNECTOR_SYNC_DOCUMENTS_ARCHIVE_MAX_RATIO if it is genuine",
            id="bomb",
        ),
        pytest.param(
            [(f"part{i}.txt", bytes(range(256)) * 400) for i in range(5)],
            {"compression": zipfile.ZIP_STORED},
            "upload.zip expands to more than 300,000 bytes; raise "
            "CONNECTOR_SYNC_DOCUMENTS_ARCHIVE_MAX_TOTAL_BYTES or split it",
            id="total-size",
        ),
        pytest.param(
            [("fine.txt", b"ok"), ("../../etc/cron.d/evil", b"evil")],
            {},
            "upload.zip: member '../../etc/cron.d/evil' has a path that escapes the archive",
            id="traversal",
        ),
        pytest.param(
            [("middle.zip", zip_bytes([("innermost.zip", zip_bytes([("x.txt", b"x")]))]))],
            {},
            "upload.zip: middle.zip/innermost.zip is an archive nested more than 1 deep; raise "
            "CONNECTOR_SYNC_DOCUMENTS_ARCHIVE_MAX_DEPTH or expand it first",
            id="nesting",
        ),
        pytest.param(
            [("a.txt", b"a"), ("secret.txt", b"s")],
            {"encrypted": ["secret.txt"]},
            "upload.zip: secret.txt is encrypted; upload an archive without a password",
            id="encrypted",
        ),
    ],
)
def test_unsafe_archives_are_refused_and_the_worker_keeps_serving(
    engine: Engine, tmp_path: Path, members: list[tuple[str, bytes]], options: Any, message: str
) -> None:
    ws = engine.create_workspace("uploads")
    archive = tmp_path / "upload.zip"
    archive.write_bytes(zip_bytes(members, **options))
    refused = engine.ingest(archive, ws.id)
    fine = engine.ingest(write_text(tmp_path / "after.txt", paragraphs=3), ws.id)
    worker = worker_with(engine)
    worker.slot("ingestion").kind.limits = DocumentLimits(archive_max_total_bytes=300_000)
    try:
        drain(worker)
    finally:
        worker.close()
    done = engine.ingestion(refused.id)
    assert (done.kind, done.status, done.attempts) == ("archive", "failed", 1)
    assert done.error == {"kind": "document", "message": message}
    assert engine.ingestions(archive_id=refused.id) == []  # nothing of it was queued
    assert engine.ingestion(fine.id).status == "ready"


def test_an_archive_is_expanded_and_each_member_ingested(engine: Engine, tmp_path: Path) -> None:
    ws = engine.create_workspace("uploads")
    inner = zip_bytes([("inside.md", b"# Inner\n\nThe anchor bolt torque schedule.\n")])
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(
        zip_bytes(
            [
                ("readme.txt", b"The guardrail inspection passed on level three.\n"),
                ("docs/", b""),
                ("docs/notes.html", b"<p>Membrane flashing at the roof drain.</p>"),
                ("sub/inner.zip", inner),
            ]
        )
    )
    ingestion = engine.ingest(archive, ws.id)
    worker = worker_with(engine)
    try:
        drain(worker)
        members = {m.member_path: m for m in engine.ingestions(archive_id=ingestion.id)}
        again = engine.ingest(archive, ws.id)  # the same bytes: no member is queued again
        drain(worker)
    finally:
        worker.close()
    done = engine.ingestion(ingestion.id)
    assert (done.kind, done.status, done.results["members"]) == ("archive", "ready", 3)
    assert set(members) == {"readme.txt", "docs/notes.html", "sub/inner.zip/inside.md"}
    assert all(engine.ingestion(m.id).status == "ready" for m in members.values())
    (hit,) = engine.search("anchor bolt torque", ws.id, limit=1)
    assert (hit.document_name, hit.member_path) == ("inside.md", "sub/inner.zip/inside.md")
    assert engine.ingestion(again.id).status == "ready"
    assert engine.ingestions(archive_id=again.id) == []


def test_an_expansion_whose_worker_died_is_reclaimed_and_the_old_worker_writes_nothing(
    engine: Engine, admin: Any, tmp_path: Path
) -> None:
    ws = engine.create_workspace("uploads")
    archive = tmp_path / "bundle.zip"
    archive.write_bytes(zip_bytes([("a.txt", b"alpha beta gamma")]))
    engine.ingest(archive, ws.id)
    worker = worker_with(engine)
    try:
        assert worker.poll()  # the document stage hands it to the archive kind
        store = IngestionStore(engine.pool)
        reclaim = timedelta(seconds=engine.settings.archive_reclaim_seconds)
        first = store.claim_archive("dead-worker", reclaim, None)
        assert first is not None and first.processing_since is not None
        assert store.claim_archive("other", reclaim, None) is None  # still fresh
        admin.execute(
            "UPDATE ingestions SET processing_since = processing_since - interval '16 minutes'"
        )
        second = store.claim_archive("other", reclaim, None)
        assert second is not None and second.id == first.id
        assert second.attempts == first.attempts + 1
        member = Member("a.txt", "00" * 32, "a.txt")
        stale = store.expand_archive(
            first.id, first.processing_since, members=[member], name="x.zip",
            scope=None, archive_sha256="00", indexed_with="x", results={},
        )  # fmt: skip
        assert stale == Expanded(finished=False, queued=0)
        failed = IngestionStatus.FAILED
        assert not store.end_archive(first.id, first.processing_since, failed)
    finally:
        worker.close()
    assert engine.ingestion(first.id).status == "running"
    assert engine.ingestions(archive_id=first.id) == []
