"""The bad-input corpus at the HTTP edge: huge, slow, strange and endless responses each give
one clear error, never a hang or a crash."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import respx

from connectors import HttpClient, NoConfig, PermanentError, RetryableError, next_link_pages
from connectors.testing import FakeContext

BASE = "https://api.example.test"


@pytest.fixture
def context() -> FakeContext:
    return FakeContext(config=NoConfig())


def test_a_50_mb_body_is_refused_without_reading_it_all(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    chunk = b"[" + b"1," * (1024 * 1024)
    sent = []

    def body() -> Iterator[bytes]:
        for _ in range(25):  # 50 MB if anyone read it all
            sent.append(len(chunk))
            yield chunk

    respx_mock.get(f"{BASE}/huge").mock(
        side_effect=lambda request: httpx.Response(
            200, content=body(), headers={"content-type": "application/json"}
        )
    )
    with (
        HttpClient(context, base_url=BASE) as http,
        pytest.raises(PermanentError, match="over the limit of 33554432 bytes"),
    ):
        http.get_json("/huge")
    assert sum(sent) < 40 * 1024 * 1024


def test_a_declared_huge_body_is_refused_up_front(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    respx_mock.get(f"{BASE}/huge").mock(
        return_value=httpx.Response(
            200, headers={"content-length": str(50 * 1024 * 1024)}, content=b""
        )
    )
    with HttpClient(context, base_url=BASE) as http, pytest.raises(PermanentError, match="bytes"):
        http.get("/huge")


def test_a_body_that_drips_is_cut_at_the_total_timeout(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    now = [0.0]  # the client's clock: each chunk arrives 250 ms after the one before
    chunks: list[int] = []  # how many chunks each attempt read

    def drip() -> Iterator[bytes]:
        chunks.append(0)
        for _ in range(100):
            now[0] += 0.25
            chunks[-1] += 1
            yield b" "

    respx_mock.get(f"{BASE}/slow").mock(
        side_effect=lambda request: httpx.Response(200, content=drip())
    )
    with (
        HttpClient(
            context, base_url=BASE, total_timeout=1.0, transient_retries=1, clock=lambda: now[0]
        ) as http,
        pytest.raises(RetryableError, match="took over"),
    ):
        http.get("/slow")
    # Both attempts were cut at the first chunk past 1 s, not read to their end.
    assert chunks == [5, 5]


def test_integers_beyond_64_bits_and_odd_strings_parse(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    respx_mock.get(f"{BASE}/odd").mock(
        return_value=httpx.Response(
            200,
            content=b'{"big": 123456789012345678901234567890, "nul": "a\\u0000b", "s": "\\ud800"}',
            headers={"content-type": "application/json"},
        )
    )
    with HttpClient(context, base_url=BASE) as http:
        body = http.get_json("/odd")
    assert body["big"] == 123456789012345678901234567890
    assert body["nul"] == "a\x00b" and body["s"] == "\ud800"  # the record writer refuses these


def test_endless_paging_with_fresh_urls_stops_at_the_page_limit(
    respx_mock: respx.MockRouter, context: FakeContext
) -> None:
    def page(request: httpx.Request) -> httpx.Response:
        n = int(request.url.params.get("n", "0"))
        return httpx.Response(200, json={"value": [n], "@odata.nextLink": f"{BASE}/p?n={n + 1}"})

    respx_mock.get(f"{BASE}/p").mock(side_effect=page)
    with (
        HttpClient(context, base_url=BASE) as http,
        pytest.raises(PermanentError, match="paging stopped after 50 pages"),
    ):
        for _ in next_link_pages(http, f"{BASE}/p", max_pages=50):
            pass
