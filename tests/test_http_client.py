"""The connector HTTP client against respx-mocked providers: retries, rate limits, refresh,
and every kind of bad response giving one clear error."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import respx

from connectors import (
    Aborted,
    AuthError,
    BearerToken,
    HttpClient,
    NoConfig,
    PermanentError,
    RateLimited,
    RetryableError,
)
from connectors.auth import Auth
from connectors.testing import FakeContext

BASE = "https://api.example.test"


@pytest.fixture
def context() -> FakeContext:
    return FakeContext(config=NoConfig())


@pytest.fixture
def client(context: FakeContext) -> Any:
    with HttpClient(context, base_url=BASE, auth=BearerToken("tok-123456")) as http:
        yield http


def test_transient_faults_are_retried_in_request(
    respx_mock: respx.MockRouter, client: HttpClient, context: FakeContext
) -> None:
    route = respx_mock.get(f"{BASE}/items").mock(
        side_effect=[
            httpx.Response(502),
            httpx.ConnectError("reset"),
            httpx.Response(503),
            httpx.Response(200, json=[1]),
        ]
    )
    assert client.get_json("/items") == [1]
    assert route.call_count == 4
    assert len(context.slept) == 3 and all(0 <= s <= 4 for s in context.slept)
    assert context.rate_limit_waits == []  # backoffs, not rate-limit waits
    assert route.calls.last.request.headers["authorization"] == "Bearer tok-123456"


def test_transient_faults_that_persist_are_retryable(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/items").mock(return_value=httpx.Response(504))
    with pytest.raises(RetryableError, match=r"GET https://api.example.test/items: 504"):
        client.get("/items")


def test_a_short_retry_after_is_slept_in_the_run(
    respx_mock: respx.MockRouter, client: HttpClient, context: FakeContext
) -> None:
    respx_mock.get(f"{BASE}/items").mock(
        side_effect=[
            httpx.Response(429, headers={"Retry-After": "7"}),
            httpx.Response(200, json={"ok": 1}),
        ]
    )
    before = datetime.now(UTC)
    assert client.get_json("/items") == {"ok": 1}
    assert context.slept == [7.0]
    assert context.rate_limit_waits == [7.0]  # counted as a rate-limit wait, not a backoff
    # The window holds every job of the budget, not only this one: it is reported.
    ((until, reason),) = context.rate_limits
    assert before + timedelta(seconds=7) <= until <= datetime.now(UTC) + timedelta(seconds=7)
    assert reason == "429 from GET https://api.example.test/items"


def test_a_long_retry_after_ends_the_attempt_and_blocks_the_budget(
    respx_mock: respx.MockRouter, client: HttpClient, context: FakeContext
) -> None:
    when = datetime.now(UTC) + timedelta(minutes=10)
    from email.utils import format_datetime

    respx_mock.get(f"{BASE}/items").mock(
        return_value=httpx.Response(
            503, headers={"Retry-After": format_datetime(when, usegmt=True)}
        )
    )
    with pytest.raises(RateLimited) as raised:
        client.get("/items")
    assert raised.value.retry_after is not None and 590 <= raised.value.retry_after <= 600
    assert len(context.rate_limits) == 1
    assert abs((context.rate_limits[0][0] - when).total_seconds()) <= 2


def test_nonsense_retry_after_falls_back_to_the_backoff_with_a_warning(
    respx_mock: respx.MockRouter, client: HttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    respx_mock.get(f"{BASE}/items").mock(
        return_value=httpx.Response(429, headers={"Retry-After": "-3"})
    )
    with caplog.at_level(logging.WARNING), pytest.raises(RateLimited) as raised:
        client.get("/items")
    assert raised.value.retry_after is None
    assert "unusable Retry-After '-3'" in caplog.text


class _Refreshing(Auth):
    def __init__(self) -> None:
        self.token, self.refreshed = "old-token", 0

    def apply(self, headers: dict[str, str]) -> None:
        headers["Authorization"] = f"Bearer {self.token}"

    def refresh(self) -> bool:
        self.refreshed += 1
        self.token = "new-token"
        return True


def test_a_401_refreshes_once_then_fails_for_good(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    auth = _Refreshing()
    route = respx_mock.get(f"{BASE}/me").mock(
        side_effect=lambda request: httpx.Response(
            200 if request.headers["authorization"] == "Bearer new-token" else 401, json={}
        )
    )
    with HttpClient(context, base_url=BASE, auth=auth) as http:
        http.get("/me")
        assert auth.refreshed == 1 and route.call_count == 2
    respx_mock.get(f"{BASE}/always").mock(return_value=httpx.Response(401))
    with (
        HttpClient(context, base_url=BASE, auth=_Refreshing()) as http,
        pytest.raises(AuthError, match="401 Unauthorized after refreshing"),
    ):
        http.get("/always")


@pytest.mark.parametrize(
    ("response", "error", "message"),
    [
        (httpx.Response(404, text="nope"), PermanentError, "404 nope"),
        (
            httpx.Response(200, text="{not json", headers={"content-type": "application/json"}),
            RetryableError,
            "not valid JSON",
        ),
        (
            httpx.Response(200, text="<html>login</html>", headers={"content-type": "text/html"}),
            RetryableError,
            "expected JSON but got text/html",
        ),
        (
            httpx.Response(200, content=b"x" * 2048, headers={"content-type": "application/json"}),
            PermanentError,
            "over the limit",
        ),
    ],
    ids=["404", "malformed-json", "html-200", "too-large"],
)
def test_bad_responses_give_one_clear_error(
    respx_mock: respx.MockRouter,
    context: FakeContext,
    response: httpx.Response,
    error: type[Exception],
    message: str,
) -> None:
    respx_mock.get(f"{BASE}/items").mock(return_value=response)
    with (
        HttpClient(context, base_url=BASE, max_body_bytes=1024) as http,
        pytest.raises(error, match=message),
    ):
        http.get_json("/items")


def test_a_redirect_loop_and_a_hung_socket_are_clear_errors(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    respx_mock.get(f"{BASE}/a").mock(
        return_value=httpx.Response(302, headers={"location": f"{BASE}/b"})
    )
    respx_mock.get(f"{BASE}/b").mock(
        return_value=httpx.Response(302, headers={"location": f"{BASE}/a"})
    )
    respx_mock.get(f"{BASE}/hang").mock(side_effect=httpx.ReadTimeout("no bytes"))
    with HttpClient(context, base_url=BASE) as http:
        with pytest.raises(PermanentError, match="too many redirects"):
            http.get("/a")
        with pytest.raises(RetryableError, match="timed out"):
            http.get("/hang")


@pytest.mark.respx(assert_all_called=False)
def test_no_request_starts_after_the_run_is_aborted(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    route = respx_mock.get(f"{BASE}/items").mock(return_value=httpx.Response(200, json=[]))
    context.aborted = True
    with HttpClient(context, base_url=BASE) as http, pytest.raises(Aborted):
        http.get("/items")
    assert route.call_count == 0


@pytest.mark.respx(assert_all_called=False)
def test_a_spent_shared_budget_waits_or_ends_the_attempt(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    route = respx_mock.get(f"{BASE}/items").mock(return_value=httpx.Response(200, json=[]))
    context.blocked_until = datetime.now(UTC) + timedelta(seconds=10)
    with HttpClient(context, base_url=BASE) as http:
        http.get("/items")
        assert len(context.slept) == 1 and 8 < context.slept[0] <= 10
        assert context.rate_limit_waits == context.slept
        context.blocked_until = datetime.now(UTC) + timedelta(hours=1)
        with pytest.raises(RateLimited, match="shared rate budget"):
            http.get("/items")
    assert route.call_count == 1


def test_a_retry_after_a_503_waits_for_a_window_another_job_heard_of_meanwhile(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    def unavailable_while_another_job_hears_of_a_window(request: httpx.Request) -> httpx.Response:
        context.blocked_until = datetime.now(UTC) + timedelta(seconds=10)
        return httpx.Response(503)

    route = respx_mock.get(f"{BASE}/items").mock(
        side_effect=[unavailable_while_another_job_hears_of_a_window, httpx.Response(200, json=[])]
    )
    with HttpClient(context, base_url=BASE) as http:
        http.get("/items")
        # The retry waited out the window before it was sent, as any first try does.
        assert len(context.rate_limit_waits) == 1 and 8 < context.rate_limit_waits[0] <= 10
        context.blocked_until = None
        route.side_effect = [
            unavailable_while_another_job_hears_of_a_window,
            httpx.Response(200, json=[]),
        ]
        context.max_inline_wait = 5.0
        # Too long a window to sleep out inside the job: the retry is not sent at all, and the
        # window, recorded already, is not reported again.
        with pytest.raises(RateLimited, match="shared rate budget"):
            HttpClient(context, base_url=BASE).get("/items")
    assert route.call_count == 3
    assert context.rate_limits == []


def test_messages_never_show_the_query_string(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    respx_mock.get(f"{BASE}/items").mock(return_value=httpx.Response(400, text="bad"))
    with HttpClient(context, base_url=BASE) as http, pytest.raises(PermanentError) as raised:
        http.get("/items", params={"api_key": "sekrit-key-123"})
    assert "sekrit" not in str(raised.value)
