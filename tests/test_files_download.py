"""HttpClient.download against respx-mocked servers: the body streamed into a file as it
arrives, the byte limit, the abort signal, rate limits and transient faults mid-body, and
redirects that never carry credentials to another host."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from connectors import Aborted, ApiKey, BearerToken, HttpClient, NoConfig, RateLimited
from connectors.errors import ContentTooLarge, PermanentError, RetryableError
from connectors.http_policy import credentials_may_follow
from connectors.testing import FakeContext

BASE = "https://api.example.test"
CDN = "https://downloads.example-cdn.test"
BLOCK = 64 * 1024
CONTENT = bytes(range(256)) * (BLOCK // 256) * 8  # 8 blocks of 64 KiB


@pytest.fixture
def context() -> FakeContext:
    return FakeContext(config=NoConfig())


@pytest.fixture
def client(context: FakeContext) -> Iterator[HttpClient]:
    with HttpClient(context, base_url=BASE, auth=BearerToken("tok-123456")) as http:
        yield http


def blocks(content: bytes, then: Any = None) -> Iterator[bytes]:
    """The content in 64 KiB blocks, as a server streams it; ``then(i)`` runs after block i."""
    for i in range(0, len(content), BLOCK):
        yield content[i : i + BLOCK]
        if then is not None:
            then(i // BLOCK)


def test_the_body_reaches_the_file_while_it_is_still_arriving(
    respx_mock: respx.MockRouter, client: HttpClient, tmp_path: Any
) -> None:
    written_when: list[int] = []
    with (tmp_path / "out").open("w+b") as out:

        def served(i: int) -> None:
            written_when.append(out.tell())

        respx_mock.get(f"{BASE}/files/7/content").mock(
            side_effect=lambda request: httpx.Response(
                200,
                content=blocks(CONTENT, served),
                headers={"Content-Type": "application/pdf", "Content-Length": str(len(CONTENT))},
            )
        )
        result = client.download("/files/7/content", out, max_bytes=len(CONTENT))
        out.seek(0)
        assert out.read() == CONTENT

    assert result.status == 200
    assert result.size == len(CONTENT)
    assert result.sha256 == hashlib.sha256(CONTENT).hexdigest()
    assert result.media_type == "application/pdf"
    # Each block was on disk before the server was asked for the next: nothing waits for the
    # whole body.
    assert written_when == [BLOCK * (i + 1) for i in range(8)]


def test_a_download_is_written_after_what_the_file_already_holds(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/a").mock(return_value=httpx.Response(200, content=b"abc"))
    out = io.BytesIO(b"kept:")
    out.seek(0, io.SEEK_END)
    result = client.download("/a", out, max_bytes=3)
    assert out.getvalue() == b"kept:abc" and result.size == 3


def test_a_declared_size_over_the_limit_is_refused_before_the_body_is_read(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    served: list[int] = []
    respx_mock.get(f"{BASE}/big").mock(
        side_effect=lambda request: httpx.Response(
            200,
            content=blocks(CONTENT, served.append),
            headers={"Content-Length": str(len(CONTENT))},
        )
    )
    out = io.BytesIO()
    with pytest.raises(ContentTooLarge, match=r"GET https://api.example.test/big: .* 1,000 bytes"):
        client.download("/big", out, max_bytes=1000)
    assert served == [] and out.getvalue() == b""


def test_a_body_that_passes_the_limit_is_refused_and_leaves_nothing(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    served: list[int] = []
    # No Content-Length (chunked): the limit is met while the body arrives.
    respx_mock.get(f"{BASE}/big").mock(
        side_effect=lambda request: httpx.Response(200, content=blocks(CONTENT, served.append))
    )
    out = io.BytesIO(b"kept")
    out.seek(0, io.SEEK_END)
    with pytest.raises(ContentTooLarge) as raised:
        client.download("/big", out, max_bytes=3 * BLOCK + 1)
    assert raised.value.limit == 3 * BLOCK + 1
    assert isinstance(raised.value, PermanentError)  # retrying cannot help
    assert out.getvalue() == b"kept"
    assert len(served) < 8  # the rest of the body was never asked for


def test_an_abort_stops_a_download_mid_body(
    respx_mock: respx.MockRouter, context: FakeContext, client: HttpClient
) -> None:
    served: list[int] = []

    def cancel_after_two(i: int) -> None:
        served.append(i)
        if i == 1:
            context.aborted = True  # the run is cancelled while block 3 is on its way

    respx_mock.get(f"{BASE}/big").mock(
        side_effect=lambda request: httpx.Response(200, content=blocks(CONTENT, cancel_after_two))
    )
    out = io.BytesIO()
    with pytest.raises(Aborted):
        client.download("/big", out, max_bytes=len(CONTENT))
    # Block 3 arrived after the cancel and was not written; nothing after it was asked for.
    assert served == [0, 1]
    assert out.getvalue() == b""


def test_a_rate_limited_download_waits_then_writes_only_the_content(
    respx_mock: respx.MockRouter, context: FakeContext, client: HttpClient
) -> None:
    route = respx_mock.get(f"{BASE}/a").mock(
        side_effect=[
            httpx.Response(429, headers={"Retry-After": "7"}, json={"error": "slow down"}),
            httpx.Response(200, content=b"the content"),
        ]
    )
    out = io.BytesIO()
    result = client.download("/a", out, max_bytes=100)
    assert out.getvalue() == b"the content" and result.size == 11
    assert context.slept == [7.0] and route.call_count == 2


def test_a_long_rate_limit_ends_the_attempt_and_writes_nothing(
    respx_mock: respx.MockRouter, context: FakeContext, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/a").mock(
        return_value=httpx.Response(429, headers={"Retry-After": "600"}, json={"error": "later"})
    )
    out = io.BytesIO()
    with pytest.raises(RateLimited) as raised:
        client.download("/a", out, max_bytes=100)
    assert raised.value.retry_after == 600.0
    assert out.getvalue() == b"" and len(context.rate_limits) == 1


def test_a_body_cut_off_midway_is_fetched_again_from_its_start(
    respx_mock: respx.MockRouter, context: FakeContext, client: HttpClient
) -> None:
    def cut(i: int) -> None:
        if i == 2:
            raise httpx.ReadError("connection reset by peer")

    route = respx_mock.get(f"{BASE}/big").mock(
        side_effect=[
            httpx.Response(200, content=blocks(CONTENT, cut)),
            httpx.Response(200, content=blocks(CONTENT)),
        ]
    )
    out = io.BytesIO()
    result = client.download("/big", out, max_bytes=len(CONTENT))
    assert out.getvalue() == CONTENT  # one copy: the partial body was dropped
    assert result.sha256 == hashlib.sha256(CONTENT).hexdigest()
    assert route.call_count == 2 and len(context.slept) == 1  # tenacity's short backoff


def test_a_download_that_keeps_timing_out_is_retryable(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/hang").mock(side_effect=httpx.ReadTimeout("no bytes"))
    out = io.BytesIO()
    with pytest.raises(RetryableError, match="timed out"):
        client.download("/hang", out, max_bytes=100)
    assert out.getvalue() == b""


def test_an_expected_status_is_returned_with_nothing_written(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/gone").mock(
        return_value=httpx.Response(404, json={"error": "not found"})
    )
    out = io.BytesIO()
    result = client.download("/gone", out, max_bytes=100, expect=(404,))
    assert (result.status, result.size, out.getvalue()) == (404, 0, b"")
    with pytest.raises(PermanentError, match="404"):
        client.download("/gone", out, max_bytes=100)


@pytest.mark.parametrize(
    ("auth", "header"),
    [(BearerToken("tok-123456"), "authorization"), (ApiKey("key-987654"), "x-api-key")],
    ids=["bearer", "api-key"],
)
def test_credentials_never_follow_a_redirect_to_another_host(
    respx_mock: respx.MockRouter, context: FakeContext, auth: Any, header: str
) -> None:
    api = respx_mock.get(f"{BASE}/files/7/content").mock(
        return_value=httpx.Response(302, headers={"Location": f"{CDN}/dl/7?sig=abc"})
    )
    cdn = respx_mock.get(f"{CDN}/dl/7").mock(return_value=httpx.Response(200, content=b"pdf"))
    out = io.BytesIO()
    with HttpClient(context, base_url=BASE, auth=auth) as http:
        http.download("/files/7/content", out, max_bytes=10)
    assert out.getvalue() == b"pdf"
    assert header in api.calls.last.request.headers
    # httpx alone drops Authorization but forwards any other header, an API key's included.
    assert header not in cdn.calls.last.request.headers
    assert "user-agent" in cdn.calls.last.request.headers


def test_credentials_stay_dropped_when_a_later_hop_comes_back(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/a").mock(
        return_value=httpx.Response(302, headers={"Location": f"{CDN}/b"})
    )
    respx_mock.get(f"{CDN}/b").mock(
        return_value=httpx.Response(302, headers={"Location": f"{BASE}/c"})
    )
    back = respx_mock.get(f"{BASE}/c").mock(return_value=httpx.Response(200, json={}))
    client.get("/a")
    assert "authorization" not in back.calls.last.request.headers


def test_a_redirect_within_the_origin_keeps_the_credentials(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/old").mock(
        return_value=httpx.Response(301, headers={"Location": f"{BASE}/new"})
    )
    new = respx_mock.get(f"{BASE}/new").mock(return_value=httpx.Response(200, json=[1]))
    assert client.get_json("/old") == [1]
    assert new.calls.last.request.headers["authorization"] == "Bearer tok-123456"


def test_messages_name_the_url_asked_for_never_where_a_redirect_led(
    respx_mock: respx.MockRouter, client: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/files/7/content").mock(
        return_value=httpx.Response(302, headers={"Location": f"{CDN}/secret-token-path"})
    )
    respx_mock.get(f"{CDN}/secret-token-path").mock(return_value=httpx.Response(403))
    with pytest.raises(PermanentError) as raised:
        client.download("/files/7/content", io.BytesIO(), max_bytes=10)
    assert "secret-token-path" not in str(raised.value)
    assert "/files/7/content" in str(raised.value)


@pytest.mark.parametrize(
    ("origin", "target", "allowed"),
    [
        ("https://a.test/x", "https://a.test/y?q=1", True),
        ("https://a.test/x", "https://a.test:443/y", True),
        ("http://a.test/x", "https://a.test/y", True),  # an upgrade to https
        ("https://a.test/x", "http://a.test/y", False),  # a downgrade
        ("https://a.test/x", "https://a.test:8443/y", False),
        ("https://a.test/x", "https://b.a.test/y", False),
        ("https://graph.microsoft.com/v1.0/x", "https://contoso.sharepoint.com/dl", False),
        ("http://a.test:8080/x", "https://a.test/y", False),
    ],
)
def test_which_redirects_may_carry_credentials(origin: str, target: str, allowed: bool) -> None:
    assert credentials_may_follow(httpx.URL(origin), httpx.URL(target)) is allowed
