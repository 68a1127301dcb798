"""Search latency against a workspace's size, with pgvector and with the real[] fallback.

    python -m bench.document_search [--chunks 10000,100000] [--queries 5] [--json]

One workspace is filled with chunks of generated text (about 150 words each, from the
vocabulary of ``bench.documents``), embedded by the default hashing embedder, on two servers in
the same run: the Postgres of ``DATABASE_URL`` without pgvector (embeddings in ``real[]``) and an
embedded Postgres 16 from ``pgserver`` (started in a temporary directory) with pgvector.
Reported per size, as medians over the queries:

- ``search()``: the whole hybrid search. With pgvector its vector side compares every chunk of
  the workspace; with ``real[]`` only the full-text candidates (see docs/documents.md);
- the exact vector scan alone: every chunk of the workspace compared with the query and the 50
  nearest kept, the vector side of pgvector's search, run on both storages: it is what the
  fallback would cost if it compared every chunk too.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import conninfo

from bench.common import (
    Column,
    add_json_option,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    migrate,
    print_json,
    print_table,
    scratch_database,
)
from bench.documents import QUERIES, _vocabulary

BATCH = 1000
SCAN = """
SELECT count(*) FROM (
    SELECT document_similarity(embedding, %(vector)s::real[]) AS similarity
      FROM document_chunks WHERE workspace_id = %(workspace)s AND embedding_model = %(model)s
     ORDER BY similarity DESC LIMIT 50) nearest
"""


@dataclass
class Row:
    chunks: int
    storage: str
    search_ms: float
    scan_ms: float


def _fill(url: str, n: int) -> int:
    from sync.documents import Chunk, DocumentStore, HashingEmbedder

    rng = random.Random(n)
    words = _vocabulary(rng)
    embedder = HashingEmbedder()
    with connect(url) as conn:
        row = conn.execute(
            "INSERT INTO workspaces (name) VALUES (%s) RETURNING id", (f"search-{n}",)
        ).fetchone()
        assert row is not None
        workspace = int(row[0])
        store = DocumentStore(conn)
        document = store.add_document(workspace, f"generated-{n}.txt", "text/plain")
        for start in range(0, n, BATCH):
            texts = [" ".join(rng.choices(words, k=150)) for _ in range(min(BATCH, n - start))]
            chunks = [Chunk(start + i, 1, t) for i, t in enumerate(texts)]
            store.upsert_chunks(document, chunks, embedder.embed(texts), model=embedder.model)
        conn.execute("ANALYZE document_chunks")
    return workspace


def _median_ms(url: str, workspace: int, rounds: int) -> tuple[float, float]:
    from sync.documents import DocumentStore, HashingEmbedder

    embedder = HashingEmbedder()
    searches, scans = [], []
    with connect(url) as conn:
        store = DocumentStore(conn)
        for query in itertools.islice(itertools.cycle(QUERIES), rounds):
            began = time.perf_counter()
            store.search(workspace, query, embedder)
            searches.append((time.perf_counter() - began) * 1000)
            params = {
                "vector": embedder.embed([query])[0],
                "workspace": workspace,
                "model": embedder.model,
            }
            began = time.perf_counter()
            conn.execute(SCAN, params)
            scans.append((time.perf_counter() - began) * 1000)
    return statistics.median(searches), statistics.median(scans)


def _pgserver(directory: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        import pgserver

        return pgserver.get_server(directory / "pgdata", cleanup_mode="delete")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="10000,100000", help="workspace sizes, in chunks")
    parser.add_argument("--queries", type=int, default=5, help="queries per size (median)")
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    sizes = [int(s) for s in args.chunks.split(",")]
    rows: list[Row] = []
    directory = Path(tempfile.mkdtemp(prefix="bench-document-search-"))
    server = _pgserver(directory)
    try:
        with scratch_database("document_search") as plain:
            console.print(f"[bold]bench.document_search[/bold]: {', '.join(map(str, sizes))}")
            machine = machine_info(plain)
            console.print(machine_line(machine))
            vector = conninfo.make_conninfo(server.get_uri("postgres"))
            for url in (plain, vector):
                migrate(url)
            for size in sizes:
                for url, storage in (
                    (plain, "real[] (Postgres 15)"),
                    (vector, "pgvector 0.6 (16)"),
                ):
                    workspace = _fill(url, size)
                    search_ms, scan_ms = _median_ms(url, workspace, args.queries)
                    rows.append(Row(size, storage, search_ms, scan_ms))
                    console.print(
                        f"  {size:>9,} {storage:22} search {search_ms:9.1f} ms  "
                        f"exact scan {scan_ms:9.1f} ms"
                    )
    finally:
        server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)
    print_table(
        "Search latency by workspace size (hashing embedder, 256 dimensions; medians)",
        [
            "chunks",
            Column("storage", "left"),
            "search() ms",
            "exact vector scan ms",
            "µs per chunk",
        ],
        [
            [
                f"{r.chunks:,}",
                r.storage,
                f"{r.search_ms:,.1f}",
                f"{r.scan_ms:,.1f}",
                f"{r.scan_ms * 1000 / r.chunks:,.2f}",
            ]
            for r in rows
        ],
    )
    print_json("document_search", args, rows, machine=machine)


if __name__ == "__main__":
    main()
