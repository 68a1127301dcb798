"""Each paginator of a provider file reads every page of a listing, shaped as the providers
that page that way document it, and says after each page where a later attempt resumes;
resumed there, it asks for no page before it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.declarative.helpers import API, open_connector, positions, read_table, rows

HEAD = """
provider: tiny
config: {base_url: {type: string}}
base_url: "{config.base_url}"
tables:
  - name: users
    path: /users
"""

ALL = [{"id": i, "name": f"user {i}"} for i in range(1, 8)]


def link_header(request: httpx.Request) -> httpx.Response:
    """GitHub's way: page and per_page, the next page's URL in Link."""
    page = int(request.url.params.get("page", "1"))
    size = int(request.url.params["per_page"])
    headers = {}
    if page * size < len(ALL):
        headers["Link"] = f'<{API}/users?page={page + 1}&per_page={size}>; rel="next"'
    return httpx.Response(200, json=ALL[(page - 1) * size : page * size], headers=headers)


def next_url(request: httpx.Request) -> httpx.Response:
    """A JSON:API-like body: data, and links.next (absent on the last page)."""
    start = int(request.url.params.get("start", "0"))
    body: dict[str, Any] = {"data": ALL[start : start + 3], "links": {}}
    if start + 3 < len(ALL):
        body["links"]["next"] = f"{API}/users?start={start + 3}"
    return httpx.Response(200, json=body)


def cursor(request: httpx.Request) -> httpx.Response:
    """Slack's way: response_metadata.next_cursor, empty on the last page."""
    start = int(request.url.params.get("cursor", "0") or 0)
    following = str(start + 3) if start + 3 < len(ALL) else ""
    return httpx.Response(
        200,
        json={"members": ALL[start : start + 3], "response_metadata": {"next_cursor": following}},
    )


def offset(request: httpx.Request) -> httpx.Response:
    start, limit = int(request.url.params["offset"]), int(request.url.params["limit"])
    return httpx.Response(200, json={"results": ALL[start : start + limit]})


def page_number(request: httpx.Request) -> httpx.Response:
    """Procore's way: page and per_page, the count in a Total header."""
    page, size = int(request.url.params["page"]), int(request.url.params["per_page"])
    body = ALL[(page - 1) * size : page * size]
    return httpx.Response(200, json=body, headers={"Total": str(len(ALL))})


CASES = {
    "link_header": (
        "paginator: {type: link_header}\n    params: {per_page: 3}",
        link_header,
        [{"next": f"{API}/users?page=2&per_page=3"}, {"next": f"{API}/users?page=3&per_page=3"}],
    ),
    "next_url": (
        "paginator: {type: next_url, path: links.next}\n    records: data",
        next_url,
        [{"next": f"{API}/users?start=3"}, {"next": f"{API}/users?start=6"}],
    ),
    "cursor": (
        "paginator: {type: cursor, path: response_metadata.next_cursor, param: cursor}\n"
        "    records: members",
        cursor,
        [{"cursor": "3"}, {"cursor": "6"}],
    ),
    "offset": (
        "paginator: {type: offset, limit: 3}\n    records: results",
        offset,
        [{"offset": 3}, {"offset": 6}],
    ),
    "page_number": (
        "paginator: {type: page_number, size: 3, total_header: Total}",
        page_number,
        [{"page": 2}, {"page": 3}],
    ),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_every_page_is_read_and_each_says_where_the_next_begins(kind: str, respx_mock: Any) -> None:
    options, answer, expected = CASES[kind]
    route = respx_mock.get(url__startswith=f"{API}/users").mock(side_effect=answer)
    connector, _ = open_connector(HEAD + f"    {options}\n")

    read = read_table(connector, "users")

    assert rows(read) == ALL
    assert [p["page"] for p in positions(read)] == expected
    assert route.call_count == 3


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_resumed_listing_starts_at_its_position(kind: str, respx_mock: Any) -> None:
    options, answer, expected = CASES[kind]
    route = respx_mock.get(url__startswith=f"{API}/users").mock(side_effect=answer)
    resumed = {("users", None): {"page": expected[1], "since": None}}
    connector, _ = open_connector(HEAD + f"    {options}\n", positions=resumed)

    read = read_table(connector, "users")

    assert rows(read) == ALL[6:]  # the last page only
    assert route.call_count == 1


def test_without_a_paginator_one_request_is_the_listing(respx_mock: Any) -> None:
    respx_mock.get(f"{API}/users").respond(json={"users": ALL[:2]})
    connector, _ = open_connector(HEAD + "    records: users\n")

    assert rows(read_table(connector, "users")) == ALL[:2]


def test_a_body_that_is_not_a_list_of_records_fails_the_table(respx_mock: Any) -> None:
    from connectors.errors import PermanentError

    respx_mock.get(f"{API}/users").respond(json={"users": "none"})
    connector, _ = open_connector(HEAD + "    records: users\n")

    with pytest.raises(PermanentError, match="expected a list of records in `users`"):
        read_table(connector, "users")
