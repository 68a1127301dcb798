"""The chunk store and search, one behaviour suite run on every storage set-up: the system
Postgres 15 without pgvector (real[]), and an embedded Postgres 16 with pgvector created by the
migration, pgvector installed beforehand in another schema, and a migrating role that may not
create extensions."""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from sync.documents import Chunk, DocumentStore, HashingEmbedder, VectorStorage
from sync.store.migrations import grant
from tests.documents_databases import SETUPS, ChunkDatabase, chunk_database, start_pgserver

EMBEDDER = HashingEmbedder()

CORPUS = [
    "Structural steel beams for level three are W12x26, revision C of drawing S-301.",
    "Concrete pour schedule: slab on grade Tuesday, elevated deck the following week.",
    "Fire door hardware: closers, panic bars and magnetic hold-opens per section 08 71 00.",
    "Site walk notes: guardrails missing on the east stair, fix before Friday's inspection.",
    "Steel erection sequence follows the crane plan; beams are bolted before welding.",
]


@pytest.fixture(scope="module")
def pgserver() -> Iterator[Any]:
    # Not under pytest's base temporary directory: pytest keeps only the last three of those
    # per user, so other pytest sessions starting on this machine delete the oldest one, and a
    # Postgres whose data directory disappears shuts down at once.
    directory = Path(tempfile.mkdtemp(prefix="connector-sync-pgserver-"))
    server = start_pgserver(directory / "pgdata")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


# Every set-up but the system Postgres's runs on an embedded Postgres 16: a process of its own.
@pytest.fixture(
    params=[
        s if s == "postgres-real[]" else pytest.param(s, marks=pytest.mark.slow) for s in SETUPS
    ]
)
def db(request: pytest.FixtureRequest) -> Iterator[ChunkDatabase]:
    server = None if request.param == "postgres-real[]" else request.getfixturevalue("pgserver")
    with chunk_database(request.param, server) as database:
        yield database


def _chunks(texts: list[str], page: int = 1) -> list[Chunk]:
    return [Chunk(i, page, text) for i, text in enumerate(texts)]


def _index(conn: psycopg.Connection[Any], workspace: int, name: str, texts: list[str]) -> int:
    store = DocumentStore(conn)
    document = store.add_document(workspace, name, "text/plain")
    store.upsert_chunks(document, _chunks(texts), EMBEDDER.embed(texts), model=EMBEDDER.model)
    return document


def test_embeddings_are_stored_as_the_setup_allows(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        assert store.vector_storage() is db.expected


def test_a_replayed_batch_rewrites_nothing(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        before = conn.execute(
            "SELECT chunk_index, xmin::text FROM document_chunks ORDER BY 1"
        ).fetchall()
        again = store.upsert_chunks(
            document, _chunks(CORPUS), EMBEDDER.embed(CORPUS), model=EMBEDDER.model
        )
        after = conn.execute(
            "SELECT chunk_index, xmin::text FROM document_chunks ORDER BY 1"
        ).fetchall()
        assert again == 0 and after == before  # no new row version
        changed = [*CORPUS[:2], "a new third chunk", *CORPUS[3:]]
        assert (
            store.upsert_chunks(
                document, _chunks(changed), EMBEDDER.embed(changed), model=EMBEDDER.model
            )
            == 1
        )
        texts = [
            r[0] for r in conn.execute("SELECT text FROM document_chunks ORDER BY chunk_index")
        ]
        assert texts == changed


def test_the_tail_of_a_longer_version_is_deleted(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        other = _index(conn, db.workspaces[0], "other.txt", CORPUS)
        assert store.delete_chunks_from(document, 2) == 3
        assert store.count_chunks(document) == 2 and store.count_chunks(other) == 5
        indexes = [
            r[0]
            for r in conn.execute(
                "SELECT chunk_index FROM document_chunks WHERE document_id = %s ORDER BY 1",
                (document,),
            )
        ]
        assert indexes == [0, 1]


def test_writes_commit_with_the_callers_transaction(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = store.add_document(db.workspaces[0], "spec.txt", "text/plain")
        with pytest.raises(RuntimeError), conn.transaction():
            store.upsert_chunks(
                document, _chunks(CORPUS), EMBEDDER.embed(CORPUS), model=EMBEDDER.model
            )
            raise RuntimeError("the fence said the lease is lost")
        assert store.count_chunks(document) == 0


def test_search_ranks_matching_chunks_first_with_document_and_page(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = store.add_document(db.workspaces[0], "plans.pdf", "application/pdf")
        chunks = [Chunk(i, i + 1, text) for i, text in enumerate(CORPUS)]
        store.upsert_chunks(document, chunks, EMBEDDER.embed(CORPUS), model=EMBEDDER.model)
        hits = store.search(db.workspaces[0], "steel beams", EMBEDDER, limit=3)
    # The two chunks that hold both words come first; which of them leads is the vectors' call.
    assert {h.chunk_index for h in hits[:2]} == {0, 4}
    top = next(h for h in hits if h.chunk_index == 0)
    assert (top.document_id, top.document_name, top.page) == (document, "plans.pdf", 1)
    assert top.text == CORPUS[0]
    assert top.similarity is not None and top.similarity > 0.3 and top.text_score is not None
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_stop_words_match_nothing_and_a_word_matches_its_other_forms(db: ChunkDatabase) -> None:
    lease = "The lease is renewed at a third of its length by the lease keeper."
    with db.connect() as conn:
        store = DocumentStore(conn)
        _index(conn, db.workspaces[0], "notes.txt", [*CORPUS, lease])
        # Words that every English text holds find nothing by their words.
        assert all(h.text_score is None for h in store.search(db.workspaces[0], "is the", EMBEDDER))
        hits = store.search(db.workspaces[0], "How is the renewal of a lease done?", EMBEDDER)
    assert hits[0].text == lease and hits[0].text_score is not None  # renewal: renewed


def test_a_good_match_scores_far_above_a_poor_one(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        good = store.search(db.workspaces[0], "steel beams", EMBEDDER, limit=1)
        partial = store.search(db.workspaces[0], "steel sourdough starter", EMBEDDER, limit=1)
        none = store.search(db.workspaces[0], "sourdough bread recipe", EMBEDDER, limit=1)
    # Every word held: about half the text score and a close vector; one rare word of three:
    # a third of that; no word: a hashing collision at most.
    assert good[0].score > 0.4
    assert "steel" in partial[0].text.lower() and partial[0].score < good[0].score / 2
    assert all(h.score < 0.1 for h in none)


def test_search_never_returns_another_workspaces_chunks(db: ChunkDatabase) -> None:
    mine, theirs = db.workspaces
    with db.connect() as conn:
        store = DocumentStore(conn)
        own = _index(conn, mine, "mine.txt", CORPUS[:2])
        _index(conn, theirs, "theirs.txt", CORPUS)
        hits = store.search(mine, "steel beams concrete fire door guardrails", EMBEDDER, limit=50)
        assert hits and {h.document_id for h in hits} == {own}
        # Only their document has the word; in mine, at most a hashing collision is found.
        assert all(h.document_id == own for h in store.search(mine, "guardrails", EMBEDDER))


def test_a_chunk_cannot_be_filed_in_another_workspace(db: ChunkDatabase) -> None:
    mine, theirs = db.workspaces
    with db.connect() as conn:
        document = _index(conn, mine, "mine.txt", CORPUS[:1])
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute(
                "UPDATE document_chunks SET workspace_id = %s WHERE document_id = %s",
                (theirs, document),
            )


def test_vectors_of_another_model_are_not_compared(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        hits = store.search(db.workspaces[0], "steel beams", HashingEmbedder(32))
    assert [h.chunk_index for h in hits] == [0, 4]  # found by their words only
    assert all(h.similarity is None for h in hits)


def test_deleting_a_document_deletes_its_chunks(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        conn.execute("DELETE FROM documents WHERE id = %s", (document,))
        assert store.count_chunks(document) == 0


def test_a_query_without_words_finds_nothing(db: ChunkDatabase) -> None:
    with db.connect() as conn:
        store = DocumentStore(conn)
        _index(conn, db.workspaces[0], "spec.txt", CORPUS)
        assert store.search(db.workspaces[0], " -- ?! ", EMBEDDER) == []


@pytest.mark.slow
def test_both_storages_rank_alike(tmp_path: Path, pgserver: Any) -> None:
    """pgvector's distance and the real[] fallback's SQL give the same ranking and scores."""
    results = []
    for setup in ("postgres-real[]", "pgvector"):
        with chunk_database(setup, pgserver) as database, database.connect() as conn:
            store = DocumentStore(conn)
            _index(conn, database.workspaces[0], "spec.txt", CORPUS)
            hits = store.search(
                database.workspaces[0], "steel beam crane welding", EMBEDDER, limit=5
            )
            results.append(hits)
    array, vector = results
    assert [h.chunk_index for h in array] == [h.chunk_index for h in vector]
    for a, v in zip(array, vector, strict=True):
        assert a.score == pytest.approx(v.score)
        assert (a.similarity is None) == (v.similarity is None)
        if a.similarity is not None and v.similarity is not None:
            assert a.similarity == pytest.approx(v.similarity, abs=1e-6)


@pytest.mark.slow
def test_pgvector_computes_the_similarity(pgserver: Any) -> None:
    with chunk_database("pgvector", pgserver) as database, database.connect() as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN VERBOSE SELECT document_similarity(embedding, '{1,0}'::real[]) "
                "FROM document_chunks"
            )
        )
    assert "<=>" in plan  # pgvector's operator, inlined; not the fallback's SQL


@pytest.mark.slow
def test_a_runtime_role_with_data_rights_only_can_index_and_search(pgserver: Any) -> None:
    with chunk_database("pgvector", pgserver) as database:
        role = f"runtime_{uuid.uuid4().hex[:8]}"
        with database.connect(row_factory=dict_row) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            grant(admin, "sync", role)
        try:
            runtime = ChunkDatabase(
                database.setup,
                psycopg.conninfo.make_conninfo(database.url, user=role),
                "sync",
                database.expected,
                database.workspaces,
            )
            with runtime.connect() as conn:
                store = DocumentStore(conn)
                assert store.vector_storage() is VectorStorage.PGVECTOR
                _index(conn, database.workspaces[0], "spec.txt", CORPUS)
                assert (
                    DocumentStore(conn)
                    .search(database.workspaces[0], "fire door", EMBEDDER)[0]
                    .chunk_index
                    == 2
                )
        finally:
            with database.connect() as admin:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


class _Synonyms:
    """A stand-in for a semantic model: "car" and "automobile" point the same way."""

    model = "synonyms-3"
    dimensions = 3

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [
            [1.0, 0.0, 0.0] if {"car", "automobile"} & set(t.lower().split()) else [0.0, 1.0, 0.0]
            for t in texts
        ]


def test_a_match_by_meaning_alone_is_found_only_with_pgvector(db: ChunkDatabase) -> None:
    texts = ["parking for one automobile per unit", "bicycle storage room"]
    embedder = _Synonyms()
    with db.connect() as conn:
        store = DocumentStore(conn)
        document = store.add_document(db.workspaces[0], "spec.txt", "text/plain")
        store.upsert_chunks(document, _chunks(texts), embedder.embed(texts), model=embedder.model)
        hits = store.search(db.workspaces[0], "car", embedder)
    if db.expected is VectorStorage.PGVECTOR:
        assert [(h.chunk_index, h.text_score) for h in hits] == [(0, None)]
    else:  # the real[] fallback ranks the full-text candidates only, and no chunk says "car"
        assert hits == []


def test_a_prepared_upsert_casts_the_batchs_vectors_once() -> None:
    """Plan regression: psycopg prepares a statement run five times, and Postgres may then use
    a generic plan, where an inlined cast of the batch's flat vector array is evaluated again
    for every row (200 x 51,200 floats per batch; the upsert ran 2.4 times slower)."""
    text = _queries_text("upsert_chunks")
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)[sb]", number, text)
    # The types psycopg sends: Python floats go as float8, so the SQL casts them to real[].
    types = {
        "document_id": ("bigint", "1"),
        "model": ("text", "'m'"),
        "dims": ("integer", "2"),
        "vectors": ("float8[]", "'{1,0,0,1}'"),
        "indexes": ("integer[]", "'{0,1}'"),
        "pages": ("integer[]", "'{1,1}'"),
        "texts": ("text[]", "'{a,b}'"),
    }
    values = {name: value for name, (_, value) in types.items()}
    with chunk_database("postgres-real[]", None) as db, db.connect() as conn, conn.transaction():
        signature = ", ".join(types[name][0] for name in names)
        conn.execute(f"PREPARE upsert ({signature}) AS {prepared}")
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        arguments = ", ".join(values[name] for name in names)
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN VERBOSE EXECUTE upsert({arguments})"))
        conn.execute("DEALLOCATE upsert")
    # Each row slices the materialized CTE's array; never a cast of the parameter, per row.
    assert "v.flat[" in plan and "::real[])[" not in plan, plan


def _queries_text(name: str) -> str:
    from sync.documents.store import DOCUMENT_QUERIES

    return DOCUMENT_QUERIES[name].as_string(None)
