"""`connector-sync ingest`, `search` and `ingestions list|show|cancel`: a local file indexed
by a worker process while `ingest --wait` shows its progress, hits with their file and page,
output that fits 80 columns, --json, and one-line errors with exit code 2."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sync.ingestions.models import Ingestion, IngestionKind, IngestionStatus
from tests.cli_backends import Backend, Cli
from tests.conftest import DATABASE_URL
from tests.documents_fixtures import pdf
from tests.ingestion_support import chunk_count, drain, worker_with, write_text


@pytest.fixture
def cli(schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    env: dict[str, str | None] = {"DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema}
    backend = Backend("database_url", env, schema, None)
    backend.engine().close()
    return Cli(backend, capsys, monkeypatch)


def narrow(text: str) -> None:
    assert all(len(line) <= 80 for line in text.splitlines()), text


@pytest.mark.slow
def test_ingest_wait_search_and_the_ingestion_in_detail(cli: Cli, tmp_path: Path) -> None:
    cli("workspaces", "create", "site").ok()
    path = write_text(tmp_path / "site walk.txt", paragraphs=60)
    total = chunk_count(path)
    worker = cli.worker(CONNECTOR_SYNC_POLL_INTERVAL="0.2")
    try:
        waited = cli("ingest", str(path), "-w", "site", "--wait", columns=80).ok()
    finally:
        assert worker.stop() == 0
    narrow(waited.out)
    assert f"ingestion #1 ready: {total:,} chunks" in waited.out

    hits = cli("search", "guardrail anchor", "-w", "site", "--limit", "3", "--json").json()
    assert len(hits) == 3 and hits[0]["file"] == "site walk.txt"
    assert hits[0]["page"] == 1 and hits[0]["score"] >= hits[-1]["score"] > 0
    assert hits[0]["local_path"] == str(path)
    shown = cli("search", "guardrail anchor", "-w", "site", columns=80).ok().out
    narrow(shown)
    assert shown.startswith("1. site walk.txt  page 1, chunk ")

    listed = cli("ingestions", "list", columns=80).ok().out
    narrow(listed)
    assert "#1" in listed and "ready" in listed and f"{total:,}/{total:,}" in listed
    detail = cli("ingestions", "show", "1", columns=80).ok().out
    narrow(detail)
    for needle in ("site walk.txt", "ready", "1 of 3", f"{total:,} of {total:,} embedded"):
        assert needle in detail
    as_json = cli("ingestions", "show", "1", "--json").json()
    assert as_json["status"] == "ready" and as_json["total_units"] == total
    assert as_json["members"] == []

    ended = cli("ingestions", "cancel", "1")
    ended.one_line_error("ingestion 1 has already ended (ready)")


def test_pages_without_text_are_counted_through_the_whole_job(cli: Cli, tmp_path: Path) -> None:
    cli("workspaces", "create", "site").ok()
    path = tmp_path / "drawings.pdf"
    # Pages 2 and 4 are images only (scans): no text layer, and no OCR.
    path.write_bytes(pdf(["Steel beams on page one", None, "Concrete on page three", None]))
    queued = cli("ingest", str(path), "-w", "site", "--json").json()
    engine = cli.backend.engine()
    worker = worker_with(engine)
    try:
        drain(worker)
    finally:
        worker.close()
        engine.close()

    shown = cli("ingestions", "show", str(queued["id"]), "--json").json()
    assert shown["status"] == "ready", shown["error"]
    assert (shown["results"]["pages"], shown["results"]["skipped_pages"]) == (4, 2)
    detail = cli("ingestions", "show", str(queued["id"]), columns=80).ok().out
    narrow(detail)
    assert "4, 2 without text (skipped; no OCR)" in detail
    hits = cli("search", "concrete", "-w", "site", "--json").json()
    assert [(h["file"], h["page"]) for h in hits] == [("drawings.pdf", 3)]


def test_a_queued_ingestion_is_cancelled_at_once(cli: Cli, tmp_path: Path) -> None:
    cli("workspaces", "create", "site").ok()
    queued = cli("ingest", str(write_text(tmp_path / "a.txt", 5)), "-w", "site", "--json").json()
    assert queued["status"] == "queued" and queued["attempts"] == 0
    assert cli("ingestions", "cancel", str(queued["id"])).ok().out.strip() == (
        f"ingestion #{queued['id']} cancelled"
    )
    shown = cli("ingestions", "show", str(queued["id"]), "--json").json()
    assert shown["status"] == "cancelled" and shown["error"]["kind"] == "cancelled"


def test_ingest_takes_several_paths_and_folders(cli: Cli, tmp_path: Path) -> None:
    cli("workspaces", "create", "site").ok()
    folder = tmp_path / "handbook"
    (folder / "safety").mkdir(parents=True)
    (folder / ".git").mkdir()
    for name in ("intro.md", "safety/ladders.txt", "safety/photo.png", ".notes.txt", ".git/x.md"):
        write_text(folder / name, 2)
    extra = write_text(tmp_path / "minutes.txt", 2)
    queued = cli(
        "ingest", str(folder), str(extra), str(folder / "intro.md"), "-w", "site", "--json"
    )
    found = queued.json()
    # A folder's files in name order, hidden ones left out, each file once.
    assert [i["local_path"] for i in found["ingestions"]] == [
        str(folder / "intro.md"),
        str(folder / "safety" / "ladders.txt"),
        str(extra),
    ]
    assert found["skipped"] == [str(folder / "safety" / "photo.png")]
    said = cli("ingest", str(folder), "-w", "site", columns=80).ok().out
    assert f"ingestion #1 queued: {folder / 'intro.md'}" in said.replace("\n", "")
    assert "left out 1 file(s) of a type that cannot be indexed: photo.png" in said

    # A path that is not there refuses the whole command: nothing more is queued.
    before = len(cli("ingestions", "list", "--json").json())
    missing = cli("ingest", str(extra), str(tmp_path / "gone"), "-w", "site")
    missing.one_line_error(f"{tmp_path / 'gone'} is not a file or a folder")
    empty = tmp_path / "pictures"
    empty.mkdir()
    (empty / "site.jpg").write_bytes(b"\xff\xd8")
    cli("ingest", str(empty), "-w", "site").one_line_error("no file that can be indexed", ".jpg")
    assert len(cli("ingestions", "list", "--json").json()) == before


def test_an_unchanged_file_ingested_again_says_its_chunks_were_indexed_already(
    cli: Cli, tmp_path: Path
) -> None:
    from sync.cli.documents import describe_ingestion

    path = write_text(tmp_path / "a.txt", 12)
    total = chunk_count(path)
    with cli.backend.engine() as engine:
        ws = engine.create_workspace("site")
        first = engine.ingest(path, ws.id)
        worker = worker_with(engine)
        try:
            drain(worker)
            again = engine.ingest(path, ws.id)
            drain(worker)
        finally:
            worker.close()
        done = engine.ingestion(again.id)
    assert again.id != first.id and done.status == "ready"
    assert (done.processed_units, done.total_units) == (total, total)
    assert describe_ingestion(done, workers_alive=None, now=datetime.now(UTC)) == (
        f"ready: unchanged, its {total:,} chunks were indexed already"
    )
    shown = cli("ingestions", "show", str(done.id)).ok().out
    assert f"{total:,} of {total:,} embedded" in shown and "nothing was embedded again" in shown


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["ingest", "/no/such/file.txt", "-w", "site"], ["/no/such/file.txt is not a file"]),
        (["ingest", "{file}"], ["say which workspace: -w WORKSPACE"]),
        (["ingest", "{file}", "-w", "nowhere"], ["no workspace named 'nowhere'"]),
        (["search", "  ", "-w", "site"], ["the query is empty"]),
        (["search", "steel"], ["say which workspace"]),
        (["ingestions", "show", "99"], ["no ingestion 99"]),
        (["ingestions", "cancel", "99"], ["no ingestion 99"]),
        (["ingestions", "list", "--status", "done"], ["status must be one of"]),
        (["ingestions", "show", "x"], ["invalid value for 'INGESTION'"]),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    cli: Cli, tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    cli("workspaces", "create", "site").ok()
    file = write_text(tmp_path / "a.txt", 2)
    result = cli(*(str(file) if a == "{file}" else a for a in args))
    result.one_line_error(*needles)


def _ingestion(**changes: object) -> Ingestion:
    now = datetime.now(UTC)
    base = Ingestion(
        id=1, workspace_id=1, kind=IngestionKind.DOCUMENT, status=IngestionStatus.QUEUED,
        source="local", connection_id=None, table_name=None, external_id=None,
        local_path="/tmp/a.txt", member_path="", archive_id=None, name="a.txt", scope=None,
        document_id=None, content_sha256=None, attempts=0, max_attempts=3, queued_at=now,
        started_at=None, finished_at=None, worker_id=None, lease_owner=None,
        lease_expires_at=None, processing_since=None, cancel_requested_at=None,
        processed_units=0, total_units=None, results={}, error=None,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_describe_ingestion() -> None:
    from sync.cli.documents import describe_ingestion

    now = datetime.now(UTC)
    assert describe_ingestion(_ingestion(), workers_alive=0, now=now) == (
        "queued; no worker is running: start one with `connector-sync worker`"
    )
    resumes = _ingestion(attempts=1, processed_units=400, queued_at=now - timedelta(seconds=1))
    assert describe_ingestion(resumes, workers_alive=2, now=now) == (
        "queued, waiting for a worker, resumes at chunk 400"
    )
    retry = _ingestion(
        attempts=1, queued_at=now + timedelta(seconds=30),
        error={"kind": "retryable", "message": "the endpoint answered 503"},
    )  # fmt: skip
    assert describe_ingestion(retry, workers_alive=1, now=now).startswith(
        "retrying in 30s (attempt 2 of 3) after retryable: the endpoint answered 503"
    )
    # Without a terminal the line says when, so it does not change every second.
    at = f"{(now + timedelta(seconds=30)).astimezone(UTC):%H:%M:%S}"
    for later in (now, now + timedelta(seconds=1)):
        assert describe_ingestion(retry, workers_alive=1, now=later, countdown=False).startswith(
            f"retrying at {at} UTC (attempt 2 of 3)"
        )
    running = _ingestion(
        status=IngestionStatus.RUNNING, attempts=2, processed_units=600, total_units=1_000,
        cancel_requested_at=now,
    )  # fmt: skip
    assert describe_ingestion(running, workers_alive=1, now=now) == (
        "running attempt 2 of 3: 600 of 1,000 chunks, cancel requested"
    )
    failed = _ingestion(
        status=IngestionStatus.FAILED, error={"kind": "document", "message": "a.zip: bomb"}
    )
    assert describe_ingestion(failed, workers_alive=1, now=now) == ("failed: document: a.zip: bomb")
