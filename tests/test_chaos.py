"""The chaos run's short mode, in CI: worker processes killed, frozen and cut off, Postgres
restarted, runs cancelled and connections deleted mid-sync, files ingested throughout; every
required zero must be zero (bench/chaos.py exits 1 otherwise and prints its summary).

Beside it, each ingestion line of the reckoning is shown to count what it is there to count
(bench/chaos_ingestions.py): a stuck ingestion, a chunk past a document's tail, a live file
left unindexed, a resume that embeds again what was written, a request sent into a window a
worker had recorded."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import chaos_ingestions as ingestions
from connectors.simulated import SimulatedConfig, SimulatedDocs
from connectors.simulated.tenants import Simulation
from sync import Engine
from sync.jobs.budgets import budget_key_of
from sync.jobs.log import job_log


@pytest.mark.slow  # starts processes of its own (see tests/conftest.py)
def test_the_short_chaos_run_ends_all_zeros() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.chaos"],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=420,
    )
    summary = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, summary
    assert "all zeros" in result.stderr, summary
    print(result.stdout)


def check(admin: psycopg.Connection[Any], name: str) -> int:
    row = admin.execute(ingestions.CHECKS[name]).fetchone()
    assert row is not None
    return int(next(iter(row.values())))


LOST = "ingestions lost (not ended, or failed with no error recorded)"
PAST_TAIL = "chunks past a ready document's final chunk count"
MISSING = "ready documents missing a chunk"


def test_an_ingestion_not_ended_or_failed_silently_is_lost(
    engine: Engine, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("steel beam inspection\n")
    ws = engine.create_workspace("ws")
    queued = engine.ingest(file, ws.id)
    assert check(admin, LOST) == 1  # queued after the drain
    admin.execute(
        "UPDATE ingestions SET status = 'failed', error = NULL WHERE id = %s", [queued.id]
    )
    assert check(admin, LOST) == 1  # failed, saying nothing
    admin.execute(
        'UPDATE ingestions SET error = \'{"kind": "document", "message": "x"}\' WHERE id = %s',
        [queued.id],
    )
    assert check(admin, LOST) == 0


def test_chunks_past_the_tail_and_missing_chunks_are_counted(
    engine: Engine, admin: psycopg.Connection[Any]
) -> None:
    ws = engine.create_workspace("ws")
    row = admin.execute(
        "INSERT INTO documents (workspace_id, name, media_type, status, chunks) "
        "VALUES (%s, 'a.txt', 'text/plain', 'ready', 2) RETURNING id",
        [ws.id],
    ).fetchone()
    assert row is not None
    for index in range(3):  # a longer earlier version's chunk 2 left behind
        admin.execute(
            "INSERT INTO document_chunks (document_id, workspace_id, chunk_index, page, text, "
            "embedding_model, embedding) VALUES (%s, %s, %s, 1, 'x', 'm', "
            "document_embedding(ARRAY[1, 0]::real[]))",
            [row["id"], ws.id, index],
        )
    assert (check(admin, PAST_TAIL), check(admin, MISSING)) == (1, 0)
    admin.execute("DELETE FROM document_chunks WHERE chunk_index <> 1")
    assert (check(admin, PAST_TAIL), check(admin, MISSING)) == (0, 1)


def test_a_live_file_is_lost_unless_ready_as_the_provider_has_it_or_failed(
    engine: Engine, admin: psycopg.Connection[Any]
) -> None:
    simulation = Simulation()
    tenant = simulation.add_tenant("d0", size=30, seed=3)
    ws = engine.create_workspace("ws")
    connection = engine.create_connection(
        ws.id,
        "docs",
        "simulated_docs",
        config={"base_url": "http://127.0.0.1:9", "tenant": "d0"},
        credentials={"token": "sim-d0"},
    )
    files = [f for f in tenant.rows("files") if f["kind"] != "zip"]
    assert len(ingestions.files_lost(engine, simulation)) == len(tenant.rows("files"))

    def document(file: dict[str, Any], sha: str) -> None:
        admin.execute(
            "INSERT INTO documents (workspace_id, name, media_type, status, chunks, "
            "connection_id, table_name, external_id, content_sha256, scope) "
            "VALUES (%s, %s, 'text/plain', 'ready', 0, %s, 'files', %s, %s, %s)",
            [ws.id, file["name"], connection.id, str(file["id"]), sha,
             f"project:{file['project_id']}"],
        )  # fmt: skip

    document(files[0], files[0]["sha256"])
    document(files[1], "an earlier version")
    lost = ingestions.files_lost(engine, simulation)
    assert f"docs/{files[0]['name']}" not in lost
    assert f"docs/{files[1]['name']}" in lost
    assert len(lost) == len(tenant.rows("files")) - 1


def log_lines(*messages: tuple[float, int, int, str]) -> list[str]:
    """Lines as a worker writes them: (time, ingestion, attempt, message) through the one log
    adapter, in the format `connector-sync worker` logs with."""
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    lines = []
    for at, ingestion, number, message in messages:
        text, _ = job_log("ingestion", {"ingestion": ingestion, "attempt": number}, "w1").process(
            message, {}
        )
        record = logging.LogRecord("sync.ingestion", logging.INFO, __file__, 0, text, None, None)
        record.created, record.msecs = at, (at % 1) * 1000
        lines.append(formatter.format(record))
    return lines


def attempt(
    at: float, ingestion: int, number: int, sha: str, start: int, firsts: list[int]
) -> list[tuple[float, int, int, str]]:
    """An attempt's lines, 0.1 s apart from ``at``: its bytes, then a line per batch."""
    said = [f"12 chunk(s) of bytes sha256:{sha}, embedding from chunk {start}"]
    said += [f"embedded chunks {first}-{first + 2} of 12" for first in firsts]
    return [(at + i / 10, ingestion, number, message) for i, message in enumerate(said)]


def test_a_resume_embeds_again_only_the_batch_in_flight() -> None:
    resumed = log_lines(
        *attempt(100, 7, 1, "aa", 0, [0, 3, 6]), *attempt(200, 7, 2, "aa", 6, [6, 9])
    )
    embeds = ingestions.read_embeds(resumed)
    assert embeds.embedded == 5
    assert ingestions.embedded_again(embeds, crashes=[]) == (1, 0)


def test_a_resume_from_the_start_embeds_past_the_one_allowed() -> None:
    restarted = log_lines(
        *attempt(100, 7, 1, "aa", 0, [0, 3, 6]), *attempt(200, 7, 2, "aa", 0, [0, 3, 6])
    )
    assert ingestions.embedded_again(ingestions.read_embeds(restarted), crashes=[]) == (1, 2)


def test_new_bytes_start_again_and_a_crash_excuses_the_batches_it_lost() -> None:
    changed = log_lines(
        *attempt(100, 7, 1, "aa", 0, [0, 3]), *attempt(200, 7, 2, "bb", 0, [0, 3, 6])
    )
    assert ingestions.embedded_again(ingestions.read_embeds(changed), crashes=[]) == (0, 0)
    # Batches 3 and 6 committed asynchronously, then lost to a crash at 150: the next attempt
    # resumes at 3 and embeds both again, and 9.
    lost = log_lines(
        *attempt(100, 7, 1, "aa", 0, [0, 3, 6]), *attempt(200, 7, 2, "aa", 3, [3, 6, 9])
    )
    embeds = ingestions.read_embeds(lost)
    assert ingestions.embedded_again(embeds, crashes=[]) == (1, 1)
    assert ingestions.embedded_again(embeds, crashes=[150.0]) == (0, 0)


@pytest.fixture
def clock() -> Iterator[list[float]]:
    yield [1_000.0]


def test_a_request_inside_a_recorded_window_is_counted(clock: list[float]) -> None:
    simulation = Simulation()
    tenant = simulation.add_tenant("d0", size=30, clock=lambda: clock[0])
    tenant.configure(retry_after=3.0)
    tenant.script_faults("ok", "429")
    for at in (1_000.0, 1_001.0, 1_001.2, 1_002.0, 1_004.5):  # the second gets the 429
        clock[0] = at
        tenant.fault_for_next_request("docs")
    assert [(w.start, w.end) for w in tenant.timeline.windows] == [(1_001.0, 1_004.0)]
    url = "http://127.0.0.1:9"
    key = budget_key_of(
        SimulatedDocs, "simulated_docs", SimulatedConfig(base_url=url, tenant="d0"), {}
    )

    def stamp(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    # A worker records the window 0.1 s after it began: the request 0.1 s later was on its
    # way; the one 0.9 s later was sent into a window the budget held.
    audit = [{"key": key, "at": stamp(1_001.1), "blocked_until": stamp(1_004.05)}]
    counted = ingestions.windows_of(simulation, url, audit)
    assert (counted.announced, counted.recorded, counted.inside) == (1, 1, 1)
    other = [{"key": "simulated_docs:another", "at": stamp(1_001.1), "blocked_until": stamp(1_005)}]
    assert ingestions.windows_of(simulation, url, other).inside == 0  # nobody had heard of it
    # A worker frozen with its request on its way, its budget read, sends it as it is resumed.
    resumed = ingestions.windows_of(simulation, url, audit, resumes=[1_001.8])
    assert (resumed.inside, resumed.excused) == (0, 1)
    assert ingestions.windows_of(simulation, url, audit, resumes=[1_001.4]).inside == 1
