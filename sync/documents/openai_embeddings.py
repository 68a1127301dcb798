"""An embedder for any OpenAI-compatible embeddings endpoint (``POST {base_url}/embeddings``):
OpenAI itself, Azure OpenAI's v1 endpoint, and the many servers that speak the same API.

Requests go through the connectors' :class:`~connectors.http.HttpClient`, so they are retried,
rate-limited and aborted exactly like a connector's: 429 and 503 with Retry-After wait that long
(or requeue the job when the wait is long), 5xx and network errors are retried, other 4xx fail.
OpenAI's own signals are read too: a 429 without Retry-After waits for its
``x-ratelimit-reset-requests`` / ``x-ratelimit-reset-tokens``, and a 429 whose error code is
``insufficient_quota`` fails at once, since waiting does not restore a quota.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx
import orjson

from connectors.auth import BearerToken
from connectors.context import CachedResponse, RequestContext
from connectors.errors import ConnectorError, PermanentError
from connectors.http import HttpClient
from connectors.http_policy import Classification, Verdict, classify
from sync.base import redact
from sync.documents.embeddings import Vector

DEFAULT_BATCH = 128
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_reset(value: str | None) -> float | None:
    """Seconds from OpenAI's reset headers, which are durations such as ``1s``, ``6m0s`` or
    ``20ms``; None if absent or not a duration."""
    if not value:
        return None
    parts = _DURATION.findall(value.strip())
    if not parts or "".join(n + u for n, u in parts) != value.strip():
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def error_of(response: httpx.Response) -> Mapping[str, Any]:
    """The ``error`` object of an OpenAI error body, or an empty mapping."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def classify_openai(response: httpx.Response, now: datetime) -> Classification | None:
    """OpenAI's reading of a 429; None leaves a response to the standard classification."""
    if response.status_code != 429:
        return None
    if error_of(response).get("code") == "insufficient_quota":
        return Classification(Verdict.PERMANENT)
    standard = classify(429, response.headers, now, refreshed=False)
    if standard.wait is not None:
        return standard  # Retry-After wins
    resets = [
        parse_reset(response.headers.get(h))
        for h in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
    ]
    waits = [w for w in resets if w is not None]
    return Classification(Verdict.RATE_LIMITED, max(waits)) if waits else standard


class StandaloneContext:
    """The services an HTTP client needs, outside any job: real sleeps, no abort, no shared
    rate budget, no ETag cache. Inside a job, pass the job's context instead, so a cancel stops
    a request."""

    def __init__(
        self, max_inline_wait: float = 30.0, sleep: Callable[[float], None] | None = None
    ) -> None:
        self.max_inline_wait = max_inline_wait
        self._sleep = sleep or time.sleep
        self.logger = logging.LoggerAdapter(logging.getLogger("sync.documents.embeddings"), {})

    def check_abort(self) -> None:
        return None

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)

    def rate_limit_slept(self, seconds: float) -> None:
        return None

    def report_rate_limit(self, until: datetime, reason: str) -> None:
        self.logger.warning("embeddings endpoint rate limited until %s (%s)", until, reason)

    def rate_limited_until(self) -> datetime | None:
        return None

    def cached_response(self, url: str) -> CachedResponse | None:
        return None

    def store_response(self, url: str, response: CachedResponse) -> None:
        return None


class OpenAIEmbeddings:
    """``model`` and ``dimensions`` as the endpoint serves them. ``send_dimensions`` asks the
    endpoint for that length (OpenAI's text-embedding-3 models shorten on request; older models
    and many compatible servers refuse the parameter). ``api_key`` None sends no
    ``Authorization`` header."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimensions: int,
        api_key: str | None,
        send_dimensions: bool = False,
        batch_size: int = DEFAULT_BATCH,
        context: RequestContext | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"the embeddings base URL {base_url!r} is not an http(s) URL; "
                "give one such as https://api.openai.com/v1"
            )
        if api_key:
            redact.register(api_key)
        self._model = model
        self._dimensions = dimensions
        self._send_dimensions = send_dimensions
        self._batch = max(1, batch_size)
        self._last: httpx.Response | None = None
        self._http = HttpClient(
            context or StandaloneContext(),
            base_url=base_url.rstrip("/") + "/",
            auth=BearerToken(api_key) if api_key else None,  # a self-hosted server may need none
            on_response=self._remember,
            classify_response=classify_openai,
        )

    @property
    def model(self) -> str:
        return f"openai:{self._model}:{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIEmbeddings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        vectors: list[Vector] = []
        for start in range(0, len(texts), self._batch):
            vectors.extend(self._request(list(texts[start : start + self._batch])))
        return vectors

    def _remember(self, response: httpx.Response) -> None:
        self._last = response

    def _request(self, texts: list[str]) -> list[Vector]:
        body: dict[str, Any] = {"model": self._model, "input": texts, "encoding_format": "float"}
        if self._send_dimensions:
            body["dimensions"] = self._dimensions
        try:
            response = self._http.request("POST", "embeddings", json=body)
        except ConnectorError as exc:
            raise self._explained(exc) from None
        payload = self._http.json_of(response)
        return self._vectors(payload, len(texts))

    def _explained(self, exc: ConnectorError) -> ConnectorError:
        """The same error, saying what the endpoint said (its ``error.message``) instead of a
        raw snippet of the body."""
        error = error_of(self._last) if self._last is not None else {}
        message = error.get("message")
        if not isinstance(message, str) or not message:
            return exc
        status = self._last.status_code if self._last is not None else "?"
        kind = error.get("code") or error.get("type") or "error"
        detail = " ".join(message.split())[:300]
        exc.message = f"the embeddings endpoint answered {status} {kind}: {detail}"
        exc.args = (exc.message,)
        return exc

    def _vectors(self, payload: Any, count: int) -> list[Vector]:
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != count:
            raise PermanentError(
                f"the embeddings endpoint returned {len(data) if isinstance(data, list) else 'no'}"
                f" embeddings for {count} inputs; check that it is OpenAI-compatible"
            )
        ordered: list[Vector | None] = [None] * count
        for item in data:
            index = item.get("index") if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < count or not isinstance(vector, list):
                raise PermanentError(
                    "the embeddings endpoint returned an item without a valid index and "
                    "embedding; check that it is OpenAI-compatible"
                )
            if len(vector) != self._dimensions:
                raise PermanentError(
                    f"model {self._model} returned {len(vector)} dimensions, not "
                    f"{self._dimensions}; set dimensions to what the model serves"
                )
            ordered[index] = [float(x) for x in vector]
        vectors = [v for v in ordered if v is not None]
        if len(vectors) != count:
            raise PermanentError(
                "the embeddings endpoint returned two embeddings for one input; check that it "
                "is OpenAI-compatible"
            )
        return vectors
