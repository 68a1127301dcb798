"""The HTTP client connectors use: httpx with timeouts, a bound on body size and total time,
short in-request retries of transient faults (tenacity), the abort signal, shared rate budgets,
credential refresh, and classification of every response into the connector error types.

A short wait (Retry-After up to ``max_inline_wait``, 30 s by default) is slept inside the run
while the engine keeps the lease; a longer one ends the attempt with :class:`RateLimited` and the
run is requeued at that time.

Redirects are followed by the client itself, hop by hop, so that credentials go only where they
were meant to: a hop to another origin (Microsoft Graph's ``/content`` answers 302 to a
pre-authenticated URL on another host) is sent without the headers the ``Auth`` added, whatever
their names (httpx on its own drops ``Authorization`` only, not an API key's header).

:meth:`HttpClient.download` streams a body into a file instead of memory, under a byte limit,
with the same retries, rate limits, refresh and abort signal as every other request.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

import httpx
import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from connectors.auth import Auth
from connectors.context import CachedResponse, RequestContext
from connectors.errors import (
    AuthError,
    ConnectorError,
    ContentTooLarge,
    NotFound,
    PermanentError,
    RateLimited,
    RetryableError,
)
from connectors.files import Download
from connectors.http_policy import Classification, Verdict, classify, credentials_may_follow

ResponseClassifier = Callable[[httpx.Response, datetime], Classification | None]
"""A provider's own reading of a response (GitHub's 403 that is a rate limit, Procore's 429 whose
wait is in ``X-Rate-Limit-Reset``); None leaves the response to the standard classification."""

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
USER_AGENT = "connector-sync"
MAX_INLINE_WAITS = 5  # rate-limit waits slept inside one request before the attempt gives up
MAX_REDIRECTS = 10
DOWNLOAD_TIMEOUT = 3600.0  # a download's whole body, as a JSON body's is total_timeout

# What a cached response keeps of its headers: what paging and totals read.
_CACHED_HEADERS = ("content-type", "link", "etag", "last-modified")

_tracer = trace.get_tracer("connector_sync.http")


@dataclass
class _Tries:
    """What the tries of one request have used so far."""

    refreshed: bool = False  # the credentials were refreshed once already
    inline_waits: int = 0  # rate-limit waits slept inside the request


class _Transient(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _BudgetSpent(RateLimited):
    """A window the shared budget already holds, too long to sleep out inside the job."""


class _Sink:
    """Where a download's body goes: ``out``, from the position it had when the download began.
    Every try starts there again, so a retried or refused body leaves nothing behind."""

    def __init__(self, out: BinaryIO, max_bytes: int, timeout: float) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be zero or more")
        self.out = out
        self.start = out.tell()
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.size = 0
        self.digest = hashlib.sha256()
        self.media_type: str | None = None

    def receive(
        self,
        response: httpx.Response,
        where: str,
        deadline: float,
        check_abort: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.discard()
        declared = int(response.headers.get("content-length") or 0)
        if declared > self.max_bytes and not response.headers.get("content-encoding"):
            raise self._too_large(where)
        for chunk in response.iter_bytes():
            check_abort()
            self.size += len(chunk)
            if self.size > self.max_bytes:
                raise self._too_large(where)
            self.digest.update(chunk)
            self.out.write(chunk)
            if clock() > deadline:
                raise _Transient(f"{where}: the content took over {self.timeout:g} s to arrive")
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        self.media_type = kind or None

    def discard(self) -> None:
        self.out.seek(self.start)
        self.out.truncate()
        self.size = 0
        self.digest = hashlib.sha256()
        self.media_type = None

    def result(self, status: int) -> Download:
        self.out.flush()
        return Download(status, self.size, self.digest.hexdigest(), self.media_type)

    def _too_large(self, where: str) -> ContentTooLarge:
        return ContentTooLarge(
            f"{where}: the content is over the limit of {self.max_bytes:,} bytes; raise the "
            "limit to fetch it",
            self.max_bytes,
        )


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
        clock: Callable[[], float] = time.monotonic,
        confine_to_base_url: bool = False,
    ) -> None:
        """``confine_to_base_url``: refuse (``PermanentError``) every request, and every
        redirect, to another origin than ``base_url``'s, wherever its URL came from (a next
        link, a template); for connectors whose URLs are built from data they do not trust."""
        self._context = context
        # Seconds on a monotonic scale, for the total timeouts; a test may drive it.
        self._clock = clock
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
        )
        self._confined_to = self._client.base_url if confine_to_base_url else None
        if confine_to_base_url and not base_url:
            raise ValueError("confine_to_base_url needs a base_url")

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
        return self._request(
            method,
            url,
            params=params,
            headers=headers,
            json=json,
            data=data,
            conditional=conditional,
            expect=expect,
            follow_redirects=follow_redirects,
        )

    def download(
        self,
        url: str,
        out: BinaryIO,
        *,
        max_bytes: int,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        expect: Collection[int] = (),
        timeout: float = DOWNLOAD_TIMEOUT,
    ) -> Download:
        """GET ``url`` and stream its body into ``out`` (a seekable binary file, written from its
        current position), block by block, never holding it whole. More than ``max_bytes``
        bytes (declared or received) raises :class:`ContentTooLarge`. Redirects are followed,
        credentials only to the origin of ``url``. Retries, rate limits, refresh and the abort
        signal work as for any request; a retry starts the body again from the same position,
        and a download that fails leaves ``out`` as it found it. A status in ``expect`` is
        returned in :class:`Download` with nothing written."""
        sink = _Sink(out, max_bytes, timeout)
        try:
            response = self._request(
                "GET", url, params=params, headers=headers, expect=expect, sink=sink
            )
        except BaseException:
            sink.discard()
            raise
        if response.status_code in expect:
            sink.discard()
        return sink.result(response.status_code)

    def _request(
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
        sink: _Sink | None = None,
    ) -> httpx.Response:
        tries = _Tries()
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
                    method, url, params, headers, json, data, follow_redirects, sink
                )
            except _BudgetSpent:  # a retry held by a window another job heard of
                raise
            except RateLimited as limited:  # the token endpoint asked us to wait
                if not self._wait_inline(limited, tries):
                    raise
                continue
            if self._on_response is not None:
                self._on_response(response)
            if response.status_code in expect:
                return response
            if cached is not None and response.status_code == 304:
                return _revalidated(cached, response)
            verdict = self._classify(response, refreshed=tries.refreshed)
            where = f"{method} {_display(response.request.url)}"
            if verdict.verdict is Verdict.OK:
                if conditional and response.headers.get("etag"):
                    self._context.store_response(key, _cacheable(response))
                return response
            if verdict.verdict is Verdict.REFRESH and self._auth is not None:
                self._refresh(self._auth, where, tries)
            elif verdict.verdict is Verdict.RATE_LIMITED:
                self._wait_out(verdict, response, where, tries)
            else:
                raise _failure(verdict, response, where)

    def _refresh(self, auth: Auth, where: str, tries: _Tries) -> None:
        """After a 401: refresh the credentials for the next try, or raise :class:`AuthError`
        when they cannot refresh (a rate-limited token endpoint is waited out inline)."""
        # The credentials just sent were refused: never send them again.
        auth.refused()
        try:
            self._respect_budget()  # the token endpoint is the provider too
            renewed = auth.refresh()
        except RateLimited as limited:
            if not self._wait_inline(limited, tries):
                raise
            return
        if not renewed:
            raise AuthError(f"{where}: 401 Unauthorized and the credentials cannot refresh")
        tries.refreshed = True

    def _wait_out(
        self, verdict: Classification, response: httpx.Response, where: str, tries: _Tries
    ) -> None:
        """After a rate limit: report its window to the shared budget, and sleep out a short
        wait for the next try, or raise :class:`RateLimited` (the run waits in the queue)."""
        if verdict.nonsense_retry_after:
            self._context.logger.warning(
                "%s sent an unusable Retry-After %r; falling back to the backoff",
                where,
                response.headers.get("retry-after"),
            )
        wait = verdict.wait
        if wait is not None:
            # The window holds every request of the budget, on every worker, however
            # short: a job that sleeps it out alone leaves the others sending into it.
            self._context.report_rate_limit(
                _now() + timedelta(seconds=wait), f"{response.status_code} from {where}"
            )
        if wait is None or wait > self._max_inline_wait or tries.inline_waits >= MAX_INLINE_WAITS:
            raise RateLimited(f"{where}: {response.status_code} rate limited", wait)
        tries.inline_waits += 1
        self._context.logger.info("%s rate limited; waiting %.1f s", where, wait)
        self._rate_limit_sleep(wait)

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

    def _wait_inline(self, limited: RateLimited, tries: _Tries) -> bool:
        """Sleep out a short rate limit the credentials' token endpoint asked for; False when
        it is too long (the attempt ends and the run waits in the queue instead)."""
        wait = limited.retry_after
        if wait is not None:
            self._context.report_rate_limit(_now() + timedelta(seconds=wait), limited.message)
        if wait is None or wait > self._max_inline_wait or tries.inline_waits >= MAX_INLINE_WAITS:
            return False
        tries.inline_waits += 1
        self._context.logger.info("%s; waiting %.1f s", limited.message, wait)
        self._rate_limit_sleep(wait)
        return True

    def _rate_limit_sleep(self, wait: float) -> None:
        self._context.sleep(wait)
        self._context.rate_limit_slept(wait)

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
            self._rate_limit_sleep(wait)
            return
        raise _BudgetSpent(f"the shared rate budget is exhausted until {until:%H:%M:%S} UTC", wait)

    def _send_with_retries(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        json: Any,
        data: Mapping[str, Any] | None,
        follow_redirects: bool,
        sink: _Sink | None,
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
                if attempt.retry_state.attempt_number > 1:  # the caller checked the first
                    self._respect_budget()  # a window heard of while this one backed off
                with attempt, _request_span(method) as span:
                    response = self._send_once(
                        method, url, params, headers, json, data, follow_redirects, sink
                    )
                    span.set_attribute("http.response.status_code", response.status_code)
                    return response
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
        sink: _Sink | None,
    ) -> httpx.Response:
        self._context.check_abort()
        credentials: dict[str, str] = {}
        if self._auth is not None:
            self._auth.apply(credentials)
            in_query = self._auth.query()
            if in_query:
                params = {**(params or {}), **in_query}
        request = self._client.build_request(
            method,
            url,
            params=params,
            headers={**(headers or {}), **credentials},
            json=json,
            data=data,
        )
        where = f"{method} {_display(request.url)}"
        self._check_confined(request.url, where)
        trace.get_current_span().set_attribute("url.full", _display(request.url))
        timeout = self._total_timeout if sink is None else sink.timeout
        deadline = self._clock() + timeout
        try:
            response = self._follow(request, follow_redirects, credentials, where)
            try:
                if sink is not None and response.is_success:
                    sink.receive(response, where, deadline, self._context.check_abort, self._clock)
                    body = b""
                else:
                    body = self._read_body(response, where, deadline)
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            raise _Transient(f"{where}: timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Transient(f"{where}: network error ({type(exc).__name__}: {exc})") from None
        # Messages name the URL asked for, never where a redirect led (a pre-authenticated
        # download URL is a credential in itself).
        complete = httpx.Response(
            response.status_code, headers=response.headers, content=body, request=request
        )
        verdict = self._classify(complete, refreshed=False)
        if verdict.verdict is Verdict.TRANSIENT:
            raise _Transient(f"{where}: {complete.status_code} {_snippet(complete)}")
        return complete

    def _follow(
        self,
        request: httpx.Request,
        follow_redirects: bool,
        credentials: Mapping[str, str],
        where: str,
    ) -> httpx.Response:
        """Send ``request`` and follow its redirects (httpx builds each next request: method,
        body, cookies), dropping the credentials at the first hop to another origin; returns
        the final response, its body not read."""
        origin = request.url
        for _ in range(MAX_REDIRECTS + 1):
            response = self._client.send(request, stream=True, follow_redirects=False)
            following = response.next_request
            if not follow_redirects or following is None:
                return response
            response.close()
            self._check_confined(following.url, f"{where}: its redirect")
            if not credentials_may_follow(origin, following.url):
                for name in credentials:
                    following.headers.pop(name, None)
            request = following
        raise PermanentError(f"{where}: too many redirects (a redirect loop?)")

    def _check_confined(self, url: httpx.URL, where: str) -> None:
        base = self._confined_to
        if base is not None and not credentials_may_follow(base, url):
            raise PermanentError(
                f"{where}: refused, {url.scheme}://{url.host} is not the host of base_url "
                f"({base.scheme}://{base.host}); this connector sends requests there only"
            )

    def _read_body(self, response: httpx.Response, where: str, deadline: float) -> bytes:
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
            if self._clock() > deadline:
                raise _Transient(f"{where}: the body took over {self._total_timeout:g} s to arrive")
        return bytes(body)


def _now() -> datetime:
    return datetime.now(UTC)


def _revalidated(cached: CachedResponse, response: httpx.Response) -> httpx.Response:
    """The stored response, its headers updated by the 304's (RFC 9111, 4.3.4)."""
    fresh = {k.lower(): v for k, v in response.headers.items() if k.lower() != "content-length"}
    return httpx.Response(
        200, headers={**cached.headers, **fresh}, content=cached.body, request=response.request
    )


def _failure(verdict: Classification, response: httpx.Response, where: str) -> ConnectorError:
    """The error of a response that no refresh or wait can turn into a success."""
    status = response.status_code
    if verdict.verdict in (Verdict.REFRESH, Verdict.AUTH):
        return AuthError(f"{where}: 401 Unauthorized after refreshing the credentials")
    if verdict.verdict in (Verdict.RETRYABLE, Verdict.TRANSIENT):
        return RetryableError(f"{where}: {status} {_snippet(response)}")
    if status in (404, 410):
        return NotFound(f"{where}: {status} {_snippet(response)}")
    return PermanentError(f"{where}: {status} {_snippet(response)}")


def _cacheable(response: httpx.Response) -> CachedResponse:
    kept = {
        name.lower(): value
        for name, value in response.headers.items()
        if name.lower() in _CACHED_HEADERS or "total" in name.lower() or "per-page" in name.lower()
    }
    return CachedResponse(response.headers["etag"], kept, response.content)


def _request_span(method: str) -> Any:
    """A client span for one try of a request (OpenTelemetry's HTTP conventions), current
    while it runs, recording a failed try's exception; a no-op unless the application installed
    an OpenTelemetry SDK. The try sets ``url.full`` (without the query string) once it has
    built the request."""
    return _tracer.start_as_current_span(
        method, kind=SpanKind.CLIENT, attributes={"http.request.method": method}
    )


def _display(url: httpx.URL) -> str:
    """A URL for messages: never its query string, which may carry a key."""
    return str(url.copy_with(query=None, fragment=None))


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    text = response.content[:limit].decode("utf-8", "replace").strip().replace("\n", " ")
    return text or response.reason_phrase
