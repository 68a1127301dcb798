"""The default hashing embedder, and the OpenAI-compatible adapter against respx routes shaped
like the OpenAI embeddings API reference (responses, error bodies and rate-limit headers)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from connectors.errors import AuthError, PermanentError, RateLimited, RetryableError
from connectors.testing import FakeContext
from sync.documents import HashingEmbedder, OpenAIEmbeddings
from sync.documents.openai_embeddings import parse_reset

BASE = "https://api.openai.test/v1"
KEY = "sk-proj-4f9Qx0TESTKEYnotreal00001"


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# -- the hashing embedder ------------------------------------------------------------------


def test_hashing_vectors_are_unit_length_and_lexical() -> None:
    embedder = HashingEmbedder(256)
    query, same_words, other = embedder.embed(
        ["steel beam revision", "Revision of the STEEL beam", "concrete pour schedule"]
    )
    assert math.isclose(_cos(query, query), 1.0)
    assert _cos(query, same_words) > 0.6
    assert abs(_cos(query, other)) < 0.2
    assert embedder.embed(["--- !!"])[0] == [0.0] * 256  # no words, no direction
    assert embedder.model == "hashing-v1-256" and embedder.dimensions == 256


@given(st.text(max_size=300))
def test_hashing_is_deterministic(text: str) -> None:
    a, b = HashingEmbedder(64).embed([text, text])
    assert a == b and len(a) == 64


@pytest.mark.slow
def test_hashing_gives_the_same_vector_in_any_process() -> None:
    text = "Fire door hardware schedule, level 2"
    program = (
        "import json, sys\nfrom sync.documents import HashingEmbedder\n"
        "print(json.dumps(HashingEmbedder(128).embed([sys.argv[1]])[0]))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", program, text],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert json.loads(outputs.pop()) == HashingEmbedder(128).embed([text])[0]


# -- the OpenAI-compatible adapter ---------------------------------------------------------


class _NoConfig(BaseModel):
    pass


def _context() -> FakeContext:
    return FakeContext(config=_NoConfig())


def _adapter(context: FakeContext, **kwargs: Any) -> OpenAIEmbeddings:
    values: dict[str, Any] = {
        "base_url": BASE,
        "model": "text-embedding-3-small",
        "dimensions": 3,
        "api_key": KEY,
        "context": context,
    }
    values.update(kwargs)
    return OpenAIEmbeddings(**values)


def _ok(vectors: list[list[float]], *, reverse: bool = False) -> httpx.Response:
    data = [
        {"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)
    ]
    if reverse:
        data.reverse()
    return httpx.Response(
        200,
        json={
            "object": "list",
            "data": data,
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        },
    )


def _error(
    status: int, message: str, type_: str, code: str | None, **headers: str
) -> httpx.Response:
    return httpx.Response(
        status,
        headers=headers,
        json={"error": {"message": message, "type": type_, "param": None, "code": code}},
    )


RATE_LIMITED = (
    "Rate limit reached for text-embedding-3-small in organization org-test on requests per "
    "min (RPM): Limit 3000, Used 3000, Requested 1. Please try again in 2s."
)


@respx.mock
def test_embeds_in_order_of_index_and_sends_the_documented_request() -> None:
    route = respx.post(f"{BASE}/embeddings").mock(
        return_value=_ok([[1, 0, 0], [0, 1, 0]], reverse=True)
    )
    with _adapter(_context(), send_dimensions=True) as adapter:
        assert adapter.embed(["first", "second"]) == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
        assert adapter.model == "openai:text-embedding-3-small:3"
    request = route.calls.last.request
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert json.loads(request.content) == {
        "model": "text-embedding-3-small",
        "input": ["first", "second"],
        "encoding_format": "float",
        "dimensions": 3,
    }


@respx.mock
def test_large_inputs_are_sent_in_batches() -> None:
    route = respx.post(f"{BASE}/embeddings").mock(
        side_effect=[_ok([[1, 0, 0]] * 2), _ok([[0, 1, 0]] * 2), _ok([[0, 0, 1]])]
    )
    with _adapter(_context(), batch_size=2) as adapter:
        vectors = adapter.embed(["a", "b", "c", "d", "e"])
    assert vectors[4] == [0.0, 0.0, 1.0] and len(vectors) == 5
    assert [len(json.loads(c.request.content)["input"]) for c in route.calls] == [2, 2, 1]


@respx.mock
def test_429_with_retry_after_waits_that_long_then_succeeds() -> None:
    respx.post(f"{BASE}/embeddings").mock(
        side_effect=[
            _error(429, RATE_LIMITED, "requests", "rate_limit_exceeded", **{"retry-after": "2"}),
            _ok([[1, 0, 0]]),
        ]
    )
    context = _context()
    with _adapter(context) as adapter:
        assert adapter.embed(["a"]) == [[1.0, 0.0, 0.0]]
    assert context.slept == [2.0]


@respx.mock
def test_429_without_retry_after_waits_for_the_reset_headers() -> None:
    respx.post(f"{BASE}/embeddings").mock(
        return_value=_error(
            429,
            RATE_LIMITED,
            "tokens",
            "rate_limit_exceeded",
            **{"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"},
        )
    )
    context = _context()
    with _adapter(context) as adapter, pytest.raises(RateLimited) as caught:
        adapter.embed(["a"])
    assert caught.value.retry_after == 360.0  # past max_inline_wait: the job is requeued
    assert context.rate_limits and context.slept == []
    assert str(caught.value).startswith("the embeddings endpoint answered 429 rate_limit_exceeded")


@respx.mock
def test_insufficient_quota_fails_at_once() -> None:
    respx.post(f"{BASE}/embeddings").mock(
        return_value=_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        )
    )
    context = _context()
    with _adapter(context) as adapter, pytest.raises(PermanentError) as caught:
        adapter.embed(["a"])
    assert not isinstance(caught.value, RetryableError)
    assert str(caught.value) == (
        "the embeddings endpoint answered 429 insufficient_quota: You exceeded your current "
        "quota, please check your plan and billing details."
    )
    assert context.slept == []


@respx.mock
def test_a_refused_key_is_an_auth_error_that_does_not_show_the_key() -> None:
    respx.post(f"{BASE}/embeddings").mock(
        return_value=_error(
            401,
            "Incorrect API key provided: sk-proj-****0001. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            "invalid_api_key",
        )
    )
    with _adapter(_context()) as adapter, pytest.raises(AuthError) as caught:
        adapter.embed(["a"])
    assert "invalid_api_key" in str(caught.value) and KEY not in str(caught.value)


@respx.mock
def test_server_errors_are_retried_in_request_then_left_to_the_job() -> None:
    route = respx.post(f"{BASE}/embeddings").mock(
        side_effect=[
            _error(503, "The server is overloaded.", "server_error", None),
            _ok([[1, 0, 0]]),
        ]
    )
    with _adapter(_context()) as adapter:
        assert adapter.embed(["a"]) == [[1.0, 0.0, 0.0]]
    assert route.call_count == 2
    respx.post(f"{BASE}/embeddings").mock(
        return_value=_error(500, "The server had an error.", "server_error", None)
    )
    with _adapter(_context()) as adapter, pytest.raises(RetryableError, match="500 server_error"):
        adapter.embed(["a"])


@respx.mock
def test_a_bad_request_is_permanent_and_says_what_the_endpoint_said() -> None:
    respx.post(f"{BASE}/embeddings").mock(
        return_value=_error(
            400,
            "This model's maximum context length is 8192 tokens, however you requested 9000.",
            "invalid_request_error",
            None,
        )
    )
    with _adapter(_context()) as adapter, pytest.raises(PermanentError) as caught:
        adapter.embed(["a"])
    assert str(caught.value) == (
        "the embeddings endpoint answered 400 invalid_request_error: This model's maximum "
        "context length is 8192 tokens, however you requested 9000."
    )


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (_ok([[1, 0]]), "returned 2 dimensions, not 3; set dimensions"),
        (_ok([[1, 0, 0], [0, 1, 0]]), "returned 2 embeddings for 1 inputs"),
        (httpx.Response(200, json={"object": "list"}), "returned no embeddings for 1 inputs"),
        (
            httpx.Response(200, json={"data": [{"index": "0", "embedding": [1, 0, 0]}]}),
            "without a valid index",
        ),
    ],
)
@respx.mock
def test_malformed_answers_are_refused_clearly(response: httpx.Response, message: str) -> None:
    respx.post(f"{BASE}/embeddings").mock(return_value=response)
    with _adapter(_context()) as adapter, pytest.raises(PermanentError, match=message):
        adapter.embed(["a"])


def test_a_base_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="is not an http"):
        _adapter(_context(), base_url="api.openai.com/v1")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3s", 3723.0), ("1.5s", 1.5)],
)
def test_parse_reset(value: str, seconds: float) -> None:
    assert parse_reset(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [None, "", "soon", "5", "1s later"])
def test_parse_reset_nonsense(value: str | None) -> None:
    assert parse_reset(value) is None
