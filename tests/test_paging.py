"""Page loops stream page by page and refuse to loop forever."""

from __future__ import annotations

import httpx
import pytest
import respx

from connectors import (
    HttpClient,
    NoConfig,
    PermanentError,
    cursor_pages,
    link_header_pages,
    next_link_pages,
    page_number_pages,
)
from connectors.testing import FakeContext

BASE = "https://api.example.test"


@pytest.fixture
def http() -> HttpClient:
    return HttpClient(FakeContext(config=NoConfig()), base_url=BASE)


def test_link_header_pages_follow_rel_next(respx_mock: respx.MockRouter, http: HttpClient) -> None:
    respx_mock.get(f"{BASE}/issues", params={"page": "2"}).mock(
        return_value=httpx.Response(
            200,
            json=[3],
            headers={
                "Link": f'<{BASE}/issues?page=1>; rel="prev", <{BASE}/issues?page=1>; rel="first"'
            },
        )
    )
    respx_mock.get(f"{BASE}/issues").mock(
        return_value=httpx.Response(
            200,
            json=[1, 2],
            headers={
                "Link": f'<{BASE}/issues?page=2>; rel="next", <{BASE}/issues?page=2>; rel="last"'
            },
        )
    )
    pages = [http.json_of(r) for r in link_header_pages(http, "/issues", params={"state": "all"})]
    assert pages == [[1, 2], [3]]


def test_a_next_link_that_comes_back_is_a_loop(
    respx_mock: respx.MockRouter, http: HttpClient
) -> None:
    respx_mock.get(f"{BASE}/delta").mock(
        return_value=httpx.Response(200, json={"value": [1], "@odata.nextLink": f"{BASE}/delta2"})
    )
    respx_mock.get(f"{BASE}/delta2").mock(
        return_value=httpx.Response(200, json={"value": [2], "@odata.nextLink": f"{BASE}/delta2"})
    )
    seen = []
    with pytest.raises(PermanentError, match="paging loop"):
        for body in next_link_pages(http, f"{BASE}/delta"):
            seen.append(body["value"])
    assert seen == [[1], [2]]  # pages already yielded are kept by the caller


def test_page_numbers_stop_at_a_short_page_or_the_total(
    respx_mock: respx.MockRouter, http: HttpClient
) -> None:
    def page(request: httpx.Request) -> httpx.Response:
        number = int(request.url.params["page"])
        items = {1: [1, 2], 2: [3, 4], 3: [5]}[number]
        return httpx.Response(200, json=items, headers={"Total": "5", "Per-Page": "2"})

    route = respx_mock.get(f"{BASE}/projects").mock(side_effect=page)
    assert list(page_number_pages(http, "/projects", size=2)) == [[1, 2], [3, 4], [5]]
    assert route.call_count == 3


def test_page_numbers_trust_the_total_header(
    respx_mock: respx.MockRouter, http: HttpClient
) -> None:
    route = respx_mock.get(f"{BASE}/projects").mock(
        return_value=httpx.Response(200, json=[1, 2], headers={"Total": "2"})
    )
    assert list(page_number_pages(http, "/projects", size=2)) == [[1, 2]]
    assert route.call_count == 1


def test_a_cursor_that_repeats_is_a_loop(respx_mock: respx.MockRouter, http: HttpClient) -> None:
    respx_mock.get(f"{BASE}/events").mock(return_value=httpx.Response(200, json={"next": "abc"}))
    with pytest.raises(PermanentError, match="cursor 'abc' came back"):
        list(cursor_pages(http, "/events", cursor_param="after", next_cursor=lambda b: b["next"]))
