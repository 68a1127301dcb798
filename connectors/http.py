"""The HTTP client connectors use: httpx with timeouts, a bound on body size and total time,
short in-request retries of transient faults (tenacity), the abort signal, shared rate budgets,
credential refresh, and classification of every response into the connector error types.

A short wait (Retry-After up to ``max_inline_wait``, 30 s by default) is slept inside the run
while the engine keeps the lease; a longer one ends the attempt with :class:`RateLimited` and the
run is requeued at that time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from connectors.auth import Auth
from connectors.context import CachedResponse, RequestContext
from connectors.errors import AuthError, PermanentError, RateLimited, RetryableError
from connectors.http_policy import Classification, Verdict, classify

ResponseClassifier = Callable[[httpx.Response, datetime], Classification | None]
"""A provider's own reading of a response (GitHub's 403 that is a rate limit, Procore's 429 whose
wait is in ``X-Rate-Limit-Reset``); None leaves the response to the standard classification."""

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
USER_AGENT = "connector-sync"
MAX_INLINE_WAITS = 5  # rate-limit waits slept inside one request before the attempt gives up

# What a cached response keeps of its headers: what paging and totals read.
_CACHED_HEADERS = ("content-type", "link", "etag", "last-modified")


class _Transient(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HttpClient:
    """One per connector instance. Every method raises only connector errors (or ``Aborted``)."""

    def __init__(
        self,
        context: RequestContext,
        *,
        base_url: str = "",
        auth: Auth | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        total_timeout: float = 300.0,
        max_body_bytes: int = 32 * 1024 * 1024,
        transient_retries: int = 3,
        max_inline_wait: float | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
        classify_response: ResponseClassifier | None = None,
    ) -> None:
        self._context = context
        self._auth = auth
        self._total_timeout = total_timeout
        self._max_body = max_body_bytes
        self._retries = transient_retries
        self._max_inline_wait = (
            context.max_inline_wait if max_inline_wait is None else max_inline_wait
        )
        self._on_response = on_response
        self._classify_response = classify_response
        self._client = httpx.Client(
            base_url=base_url,
            headers={"User-Agent": USER_AGENT, **(headers or {})},
            timeout=timeout,
            follow_redirects=True,
            max_redirects=10,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        """A GET; ``conditional=True`` sends the ETag of the last response from this URL
        (``If-None-Match``) and answers a 304 with that response, as the provider asks."""
        return self.request("GET", url, **kwargs)

    def get_json(self, url: str, **kwargs: Any) -> Any:
        return self.json_of(self.get(url, **kwargs))

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: Mapping[str, Any] | None = None,
        conditional: bool = False,
        expect: Collection[int] = (),
        follow_redirects: bool = True,
    ) -> httpx.Response:
        """Send a request until it succeeds or fails for good, and return the response.
        Statuses in ``expect`` are returned as they are, for the caller to read (a 404 that
        means "deleted"); ``follow_redirects=False`` returns a redirect instead of following
        it."""
        refreshed = False
        inline_waits = 0
        cached: CachedResponse | None = None
        key = ""
        if conditional:
            key = str(self._client.build_request(method, url, params=params).url)
            cached = self._context.cached_response(key)
            if cached is not None:
                headers = {**(headers or {}), "If-None-Match": cached.etag}
        while True:
            self._respect_budget()
            try:
                response = self._send_with_retries(
                    method, url, params, headers, json, data, follow_redirects
                )
            except RateLimited as limited:  # the token endpoint asked us to wait
                if not self._wait_inline(limited, inline_waits):
                    raise
                inline_waits += 1
                continue
            if self._on_response is not None:
                self._on_response(response)
            if response.status_code in expect:
                return response
            if cached is not None and response.status_code == 304:
                # The stored response, its headers updated by the 304's (RFC 9111, 4.3.4).
                fresh = {
                    k.lower(): v
                    for k, v in response.headers.items()
                    if k.lower() != "content-length"
                }
                return httpx.Response(
                    200,
                    headers={**cached.headers, **fresh},
                    content=cached.body,
                    request=response.request,
                )
            verdict = self._classify(response, refreshed=refreshed)
            where = f"{method} {_display(response.request.url)}"
            if verdict.verdict is Verdict.OK:
                if conditional and response.headers.get("etag"):
                    self._context.store_response(key, _cacheable(response))
                return response
            if verdict.verdict is Verdict.REFRESH and self._auth is not None:
                # The credentials just sent were refused: never send them again.
                self._auth.refused()
                try:
                    renewed = self._auth.refresh()
                except RateLimited as limited:
                    if not self._wait_inline(limited, inline_waits):
                        raise
                    inline_waits += 1
                    continue
                if renewed:
                    refreshed = True
                    continue
                raise AuthError(f"{where}: 401 Unauthorized and the credentials cannot refresh")
            if verdict.verdict in (Verdict.REFRESH, Verdict.AUTH):
                raise AuthError(f"{where}: 401 Unauthorized after refreshing the credentials")
            if verdict.verdict is Verdict.RATE_LIMITED:
                if verdict.nonsense_retry_after:
                    self._context.logger.warning(
                        "%s sent an unusable Retry-After %r; falling back to the backoff",
                        where,
                        response.headers.get("retry-after"),
                    )
                wait = verdict.wait
                if (
                    wait is not None
                    and wait <= self._max_inline_wait
                    and inline_waits < MAX_INLINE_WAITS
                ):
                    inline_waits += 1
                    self._context.logger.info("%s rate limited; waiting %.1f s", where, wait)
                    self._context.sleep(wait)
                    continue
                if wait is not None:
                    self._context.report_rate_limit(
                        _now() + timedelta(seconds=wait), f"{response.status_code} from {where}"
                    )
                raise RateLimited(f"{where}: {response.status_code} rate limited", wait)
            if verdict.verdict in (Verdict.RETRYABLE, Verdict.TRANSIENT):
                raise RetryableError(f"{where}: {response.status_code} {_snippet(response)}")
            raise PermanentError(f"{where}: {response.status_code} {_snippet(response)}")

    def json_of(self, response: httpx.Response) -> Any:
        """The response's JSON body, or a clear error if it is not JSON."""
        where = f"{response.request.method} {_display(response.request.url)}"
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind and not (kind == "application/json" or kind.endswith("+json")):
            raise RetryableError(f"{where}: expected JSON but got {kind} ({_snippet(response)})")
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            try:  # integers beyond 64 bits, which orjson refuses
                return json.loads(response.content)
            except ValueError as exc:
                raise RetryableError(f"{where}: the body is not valid JSON ({exc})") from None

    # -- internals -------------------------------------------------------------------------

    def _classify(self, response: httpx.Response, *, refreshed: bool) -> Classification:
        now = _now()
        if self._classify_response is not None:
            verdict = self._classify_response(response, now)
            if verdict is not None:
                return verdict
        return classify(response.status_code, response.headers, now, refreshed=refreshed)

    def _wait_inline(self, limited: RateLimited, waits_so_far: int) -> bool:
        """Sleep out a short rate limit the credentials' token endpoint asked for; False when
        it is too long (the attempt ends and the run waits in the queue instead)."""
        wait = limited.retry_after
        if wait is None or wait > self._max_inline_wait or waits_so_far >= MAX_INLINE_WAITS:
            if wait is not None:
                self._context.report_rate_limit(_now() + timedelta(seconds=wait), limited.message)
            return False
        self._context.logger.info("%s; waiting %.1f s", limited.message, wait)
        self._context.sleep(wait)
        return True

    def _respect_budget(self) -> None:
        """Wait for (or give the attempt up to) a rate budget another run found exhausted."""
        self._context.check_abort()
        until = self._context.rate_limited_until()
        if until is None:
            return
        wait = (until - _now()).total_seconds()
        if wait <= 0:
            return
        if wait <= self._max_inline_wait:
            self._context.sleep(wait)
            return
        raise RateLimited(f"the shared rate budget is exhausted until {until:%H:%M:%S} UTC", wait)

    def _send_with_retries(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        json: Any,
        data: Mapping[str, Any] | None,
        follow_redirects: bool,
    ) -> httpx.Response:
        retrying = Retrying(
            retry=retry_if_exception_type(_Transient),
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_random_exponential(multiplier=0.5, max=4.0),
            sleep=self._context.sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._send_once(
                        method, url, params, headers, json, data, follow_redirects
                    )
        except _Transient as exc:
            raise RetryableError(exc.message) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _send_once(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        json: Any,
        data: Mapping[str, Any] | None,
        follow_redirects: bool,
    ) -> httpx.Response:
        self._context.check_abort()
        request_headers = dict(headers or {})
        if self._auth is not None:
            self._auth.apply(request_headers)
        request = self._client.build_request(
            method, url, params=params, headers=request_headers, json=json, data=data
        )
        where = f"{method} {_display(request.url)}"
        deadline = time.monotonic() + self._total_timeout
        try:
            response = self._client.send(request, stream=True, follow_redirects=follow_redirects)
            try:
                declared = int(response.headers.get("content-length") or 0)
                if declared > self._max_body:
                    raise PermanentError(f"{where}: the body is {declared} bytes, over the limit")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self._max_body:
                        raise PermanentError(
                            f"{where}: the body is over the limit of {self._max_body} bytes"
                        )
                    if time.monotonic() > deadline:
                        raise _Transient(
                            f"{where}: the body took over {self._total_timeout:g} s to arrive"
                        )
            finally:
                response.close()
        except httpx.TooManyRedirects:
            raise PermanentError(f"{where}: too many redirects (a redirect loop?)") from None
        except httpx.TimeoutException as exc:
            raise _Transient(f"{where}: timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Transient(f"{where}: network error ({type(exc).__name__}: {exc})") from None
        complete = httpx.Response(
            response.status_code, headers=response.headers, content=bytes(body), request=request
        )
        verdict = self._classify(complete, refreshed=False)
        if verdict.verdict is Verdict.TRANSIENT:
            raise _Transient(f"{where}: {complete.status_code} {_snippet(complete)}")
        return complete


def _now() -> datetime:
    return datetime.now(UTC)


def _cacheable(response: httpx.Response) -> CachedResponse:
    kept = {
        name.lower(): value
        for name, value in response.headers.items()
        if name.lower() in _CACHED_HEADERS or "total" in name.lower() or "per-page" in name.lower()
    }
    return CachedResponse(response.headers["etag"], kept, response.content)


def _display(url: httpx.URL) -> str:
    """A URL for messages: never its query string, which may carry a key."""
    return str(url.copy_with(query=None, fragment=None))


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = response.content[:limit].decode("utf-8", "replace").strip().replace("\n", " ")
    return text or response.reason_phrase
