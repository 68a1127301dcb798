"""The embedder chosen by the settings, end to end: workers embed chunks and search embeds
queries through an OpenAI-compatible endpoint (respx routes shaped like the OpenAI embeddings
API reference: POST /v1/embeddings, its list of embeddings, its error bodies), a 429 with
Retry-After requeues the ingestion until then, a search over documents embedded by another
model matches them by their words only and says so in one line, `ingestions reindex` embeds
them again, and the endpoint's API key appears in no log, error, result, page or output."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from pydantic import ValidationError

from sync import Engine
from sync.base.settings import Settings
from sync.documents import HashingEmbedder, OpenAIEmbeddings
from sync.documents.embedders import embedder_from
from tests.cli_backends import Backend, Cli
from tests.conftest import DATABASE_URL, make_settings
from tests.ingestion_support import drain, write_text
from tests.ui_support import serving

BASE = "https://embeddings.test/v1"
MODEL = "text-embedding-3-small"
DIMENSIONS = 16
OPENAI = f"openai:{MODEL}:{DIMENSIONS}"
CANARY = f"sk-proj-canary-{uuid.uuid4().hex}"
ENDPOINT_ENV = {
    "CONNECTOR_SYNC_EMBEDDER": "openai",
    "CONNECTOR_SYNC_EMBEDDINGS_URL": BASE,
    "CONNECTOR_SYNC_EMBEDDINGS_MODEL": MODEL,
    "CONNECTOR_SYNC_EMBEDDINGS_DIMENSIONS": str(DIMENSIONS),
    "CONNECTOR_SYNC_EMBEDDINGS_API_KEY": CANARY,
}
# The endpoint's vectors: deterministic, and close when texts share words, so a search by
# vector finds what it should.
VECTORS = HashingEmbedder(DIMENSIONS)


def embeddings(request: httpx.Request) -> httpx.Response:
    """An answer as the OpenAI API reference shows it, for the inputs of the request."""
    inputs = json.loads(request.content)["input"]
    data = [
        {"object": "embedding", "index": i, "embedding": vector}
        for i, vector in enumerate(VECTORS.embed(inputs))
    ]
    tokens = sum(len(text.split()) for text in inputs)
    return httpx.Response(
        200,
        json={
            "object": "list",
            "data": data,
            "model": MODEL,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        },
    )


def error(status: int, message: str, type_: str, code: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        headers=headers,
        json={"error": {"message": message, "type": type_, "param": None, "code": code}},
    )


RATE_LIMITED = error(
    429,
    "Rate limit reached for text-embedding-3-small in organization org-test on requests per "
    "min (RPM): Limit 3000, Used 3000, Requested 1. Please try again in 2m.",
    "requests",
    "rate_limit_exceeded",
    **{"retry-after": "120"},
)


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[respx.MockRouter]:
    """The endpoint's settings in the environment (the API key read from there only), and
    its route."""
    for key, value in ENDPOINT_ENV.items():
        monkeypatch.setenv(key, value)
    with respx.mock() as router:
        router.post(f"{BASE}/embeddings", name="embeddings").mock(side_effect=embeddings)
        yield router


@pytest.fixture
def cli(schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    env: dict[str, str | None] = {"DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema}
    backend = Backend("database_url", env, schema, None)
    backend.engine().close()
    return Cli(backend, capsys, monkeypatch)


def chunk_models(admin: Any, document_id: int | None) -> set[str]:
    rows = admin.execute(
        "SELECT DISTINCT embedding_model FROM document_chunks WHERE document_id = %s",
        (document_id,),
    ).fetchall()
    return {r["embedding_model"] for r in rows}


def test_the_settings_choose_the_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    default = embedder_from(Settings())
    assert isinstance(default, HashingEmbedder) and default.model == "hashing-v1-256"
    assert embedder_from(Settings(embeddings_dimensions=64)).model == "hashing-v1-64"
    for key, value in ENDPOINT_ENV.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    chosen = embedder_from(settings)
    assert isinstance(chosen, OpenAIEmbeddings) and chosen.model == OPENAI
    chosen.close()
    assert CANARY not in repr(settings) and CANARY not in str(settings.model_dump())

    monkeypatch.delenv("CONNECTOR_SYNC_EMBEDDINGS_URL")
    monkeypatch.delenv("CONNECTOR_SYNC_EMBEDDINGS_DIMENSIONS")
    with pytest.raises(ValidationError) as missing:
        Settings()
    assert (
        "the embedder `openai` needs CONNECTOR_SYNC_EMBEDDINGS_URL, "
        "CONNECTOR_SYNC_EMBEDDINGS_DIMENSIONS (or set CONNECTOR_SYNC_EMBEDDER=hashing)"
    ) in str(missing.value)
    assert CANARY not in str(missing.value)
    with pytest.raises(ValidationError, match="is not an http"):
        Settings(embeddings_url="api.openai.com/v1", embeddings_dimensions=16)


def test_a_setting_that_is_missing_is_one_line_without_the_key(cli: Cli) -> None:
    cli("workspaces", "create", "site").ok()
    result = cli(
        "search", "steel", "-w", "site", **{**ENDPOINT_ENV, "CONNECTOR_SYNC_EMBEDDINGS_MODEL": None}
    )
    line = result.one_line_error(
        "invalid setting (the embedder `openai` needs CONNECTOR_SYNC_EMBEDDINGS_MODEL"
    )
    assert CANARY not in line


def test_an_endpoint_embeds_the_chunks_and_the_queries_and_its_429_requeues(
    schema: str, admin: Any, tmp_path: Path, endpoint: respx.MockRouter
) -> None:
    route = endpoint.routes["embeddings"]
    route.side_effect = [RATE_LIMITED, *([embeddings] * 50)]
    with Engine(make_settings(schema), pool_size=6) as engine:
        engine.migrate()
        assert engine.settings.embedder == "openai"
        ws = engine.create_workspace("site")
        path = write_text(tmp_path / "walk.txt", paragraphs=30)
        ingestion = engine.ingest(path, ws.id)
        worker = engine.worker(listen=False)
        try:
            before = datetime.now(UTC)
            assert worker.poll()
            waiting = engine.ingestion(ingestion.id)
            # Retry-After: 120 is longer than max_inline_wait: back to the queue until then,
            # spending no attempt, and this worker's requests wait for it too.
            assert waiting.status == "queued" and waiting.attempts == 0
            assert waiting.error is not None and waiting.error["kind"] == "rate_limited"
            assert 110 <= (waiting.queued_at - before).total_seconds() <= 130
            blocked = worker.slot("ingestion").kind.endpoint.rate_limited_until()
            assert blocked is not None and 110 <= (blocked - before).total_seconds() <= 130
        finally:
            worker.close()
        admin.execute("UPDATE ingestions SET queued_at = now()")  # the wait is over
        again = engine.worker(listen=False)
        try:
            drain(again)
        finally:
            again.close()
        done = engine.ingestion(ingestion.id)
        assert done.status == "ready", done.error
        assert done.indexed_with is not None and done.indexed_with.startswith(f"{OPENAI}/")
        assert chunk_models(admin, done.document_id) == {OPENAI}
        for call in route.calls:
            assert call.request.url == f"{BASE}/embeddings"
            assert call.request.headers["authorization"] == f"Bearer {CANARY}"
        body = json.loads(route.calls.last.request.content)
        assert body["model"] == MODEL and body["encoding_format"] == "float"
        assert "dimensions" not in body  # only with CONNECTOR_SYNC_EMBEDDINGS_SEND_DIMENSIONS

        calls = route.call_count
        results = engine.search("guardrail anchor bolt", ws.id, limit=3)
        assert route.call_count == calls + 1  # the query, by the same endpoint
        assert json.loads(route.calls.last.request.content)["input"] == ["guardrail anchor bolt"]
        assert results.notice is None and results.model == OPENAI
        assert len(results) == 3 and results[0].document_name == "walk.txt"
        assert all(hit.similarity is not None for hit in results)


def test_documents_of_another_model_match_by_words_with_a_notice_until_reindexed(
    schema: str, admin: Any, tmp_path: Path, cli: Cli, endpoint: respx.MockRouter
) -> None:
    hashing = make_settings(schema, embedder="hashing", embeddings_dimensions=None)
    with Engine(hashing, pool_size=6) as before:
        ws = before.create_workspace("site")
        ingestion = before.ingest(write_text(tmp_path / "walk.txt", paragraphs=30), ws.id)
        worker = before.worker(listen=False)
        try:
            drain(worker)
        finally:
            worker.close()
        total = before.ingestion(ingestion.id).total_units
        assert chunk_models(admin, before.ingestion(ingestion.id).document_id) == {"hashing-v1-256"}

    with Engine(make_settings(schema), pool_size=6) as engine:
        results = engine.search("guardrail anchor", ws.id, limit=5)
        # Found by their words, their vectors compared with nothing, and the results say so.
        assert len(results) == 5 and all(h.similarity is None for h in results)
        assert all(h.text_score is not None for h in results)
        assert results.notice == (
            f"1 document(s) ({total:,} chunks) were embedded by hashing-v1-256, not the "
            f"configured {OPENAI}, so they match by their words only; `connector-sync "
            f"ingestions reindex -w {ws.id}` embeds them again"
        )
        shown = cli("search", "guardrail anchor", "-w", "site", "--json")
        assert len(shown.json()) == 10  # stdout: the hits only, as before
        notes = [line for line in shown.err.splitlines() if line.startswith("note: ")]
        assert notes == [f"note: {results.notice}"]

        assert cli("ingestions", "reindex", "-w", "site").ok().out.strip() == (
            "1 file(s) queued to be indexed again"
        )
        assert cli("ingestions", "reindex", "-w", "site", "--json").json()["queued"] == 0
        worker = engine.worker(listen=False)
        try:
            drain(worker)
        finally:
            worker.close()
        again = engine.ingestions(workspace_id=ws.id)[0]
        assert again.id != ingestion.id and again.status == "ready", again.error
        assert chunk_models(admin, again.document_id) == {OPENAI}
        after = engine.search("guardrail anchor", ws.id, limit=5)
        assert after.notice is None and all(h.similarity is not None for h in after)
        assert cli("ingestions", "reindex", "-w", "site").ok().out.strip() == (
            "every document is indexed with the configured embedder and chunks"
        )
        shown = cli("search", "guardrail anchor", "-w", "site")
        assert "note:" not in shown.ok().err


def test_the_api_key_appears_in_no_log_error_result_page_or_output(
    schema: str,
    tmp_path: Path,
    cli: Cli,
    endpoint: respx.MockRouter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint.route(host="127.0.0.1").pass_through()  # the operator page, served locally
    # A compatible server that echoes the key it refused (OpenAI's own masks most of it).
    endpoint.routes["embeddings"].side_effect = None
    endpoint.routes["embeddings"].return_value = error(
        401,
        f"Incorrect API key provided: {CANARY}. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    )
    with Engine(make_settings(schema), pool_size=6) as engine:
        ws = engine.create_workspace("site")
        ingestion = engine.ingest(write_text(tmp_path / "walk.txt", paragraphs=5), ws.id)
        worker = engine.worker(listen=False)
        try:
            drain(worker)
        finally:
            worker.close()
        failed = engine.ingestion(ingestion.id)
        assert failed.status == "failed" and failed.error is not None
        assert failed.error["kind"] == "auth"
        assert failed.error["message"].startswith(
            "the embeddings endpoint answered 401 invalid_api_key: Incorrect API key provided: "
            "[redacted]."
        )
        outputs = [json.dumps(failed.to_json())]
        for args in (
            ["ingestions", "show", str(ingestion.id)],
            ["ingestions", "show", str(ingestion.id), "--json"],
            ["ingestions", "list"],
            ["ingestions", "reindex", "-w", "site"],
        ):
            result = cli(*args).ok()
            outputs += [result.out, result.err]
        searched = cli("search", "guardrail", "-w", "site")
        searched.one_line_error("the query could not be embedded: the embeddings endpoint "
                                "answered 401 invalid_api_key")  # fmt: skip
        outputs.append(searched.err)
    with (
        Engine(make_settings(schema), pool_size=6) as engine,
        serving(engine) as url,
        httpx.Client(base_url=url) as client,
    ):
        for path in ("/ingestions", f"/ingestions/{ingestion.id}"):
            page = client.get(path, headers={"accept": "text/html"})
            assert page.status_code == 200
            outputs.append(page.text)
    assert "[redacted]" in outputs[-1]  # the page shows the error, without the key
    outputs.append(caplog.text)
    for text in outputs:
        assert CANARY not in text
