"""Page loops: each yields one page at a time, so a table of any size streams through in constant
memory, and each refuses to loop forever (a next link or token already followed is an error)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from connectors.errors import PermanentError
from connectors.http import HttpClient

MAX_PAGES = 1_000_000


class _LoopGuard:
    def __init__(self, what: str, max_pages: int) -> None:
        self._seen: set[str] = set()
        self._what = what
        self._max_pages = max_pages

    def visit(self, key: str) -> None:
        if key in self._seen:
            raise PermanentError(f"paging loop: the {self._what} {key!r} came back a second time")
        if len(self._seen) >= self._max_pages:
            raise PermanentError(f"paging stopped after {self._max_pages} pages")
        self._seen.add(key)


def link_header_pages(
    client: HttpClient,
    url: str,
    *,
    params: Mapping[str, Any] | None = None,
    max_pages: int = MAX_PAGES,
    conditional: bool = False,
) -> Iterator[httpx.Response]:
    """Follow ``Link: <...>; rel="next"`` (RFC 8288; GitHub, Procore) until there is none. To
    resume a listing, pass the next link it gave (``next_link(response)``) as ``url``. With
    ``conditional``, each page is asked for with the ETag it last came with (see
    ``HttpClient.get``)."""
    guard = _LoopGuard("next link", max_pages)
    next_url: str | None = url
    next_params = params
    while next_url is not None:
        response = client.get(next_url, params=next_params, conditional=conditional)
        guard.visit(str(response.request.url))
        yield response
        link = response.links.get("next")
        next_url = link.get("url") if link else None
        next_params = None  # the next link carries every parameter itself


def next_link_pages(
    client: HttpClient,
    url: str,
    *,
    next_key: str = "@odata.nextLink",
    params: Mapping[str, Any] | None = None,
    max_pages: int = MAX_PAGES,
    next_url: Callable[[dict[str, Any]], str | None] | None = None,
    conditional: bool = False,
) -> Iterator[Any]:
    """Follow a next URL carried in the JSON body (Microsoft Graph's ``@odata.nextLink``).
    Yields each page's parsed body. ``next_url``: a function from a page to its next URL,
    for a body that keeps it deeper than a top-level ``next_key``."""
    guard = _LoopGuard("next link", max_pages)
    following: str | None = url
    next_params = params
    while following is not None:
        guard.visit(following if next_params is None else f"{following}?{dict(next_params)}")
        body = client.get_json(following, params=next_params, conditional=conditional)
        if not isinstance(body, dict):
            raise PermanentError(f"expected a JSON object page, got {type(body).__name__}")
        yield body
        found = next_url(body) if next_url is not None else body.get(next_key)
        following = str(found) if found else None
        next_params = None


def page_number_pages(
    client: HttpClient,
    url: str,
    *,
    params: Mapping[str, Any] | None = None,
    page_param: str = "page",
    size_param: str = "per_page",
    size: int = 100,
    first: int = 1,
    items: Callable[[Any], list[Any]] = lambda body: body,
    total_header: str | None = "Total",
    max_pages: int = MAX_PAGES,
    conditional: bool = False,
) -> Iterator[list[Any]]:
    """Ask for page 1, 2, 3... until a short or empty page, or the ``total_header`` count is
    reached (Procore sends ``Total`` and ``Per-Page``). Yields each page's items."""
    page = first
    fetched = 0
    for _ in range(max_pages):
        query = {**(params or {}), page_param: page, size_param: size}
        response = client.get(url, params=query, conditional=conditional)
        found = items(client.json_of(response))
        if not isinstance(found, list):
            raise PermanentError(f"expected a JSON list of items, got {type(found).__name__}")
        if found:
            yield found
        fetched += len(found)
        total = _int_header(response, total_header)
        if len(found) < size or (total is not None and fetched >= total):
            return
        page += 1
    raise PermanentError(f"paging stopped after {max_pages} pages")


def cursor_pages(
    client: HttpClient,
    url: str,
    *,
    cursor_param: str,
    next_cursor: Callable[[Any], str | None],
    params: Mapping[str, Any] | None = None,
    max_pages: int = MAX_PAGES,
    start: str | None = None,
    conditional: bool = False,
) -> Iterator[Any]:
    """Pass an opaque cursor token from each page to the next request. Yields parsed bodies.
    ``start``: a token a page gave, to resume the listing there."""
    guard = _LoopGuard("cursor", max_pages)
    cursor: str | None = start
    while True:
        query = dict(params or {})
        if cursor is not None:
            query[cursor_param] = cursor
        body = client.get_json(url, params=query, conditional=conditional)
        yield body
        cursor = next_cursor(body)
        if not cursor:
            return
        guard.visit(cursor)


def offset_pages(
    client: HttpClient,
    url: str,
    *,
    params: Mapping[str, Any] | None = None,
    offset_param: str = "offset",
    limit_param: str = "limit",
    limit: int = 100,
    start: int = 0,
    items: Callable[[Any], list[Any]] = lambda body: body,
    max_pages: int = MAX_PAGES,
    conditional: bool = False,
) -> Iterator[list[Any]]:
    """Ask for ``offset=0, limit, 2*limit...`` until a short or empty page. Yields each page's
    items. ``start``: the offset to resume from."""
    offset = start
    for _ in range(max_pages):
        query = {**(params or {}), offset_param: offset, limit_param: limit}
        found = items(client.get_json(url, params=query, conditional=conditional))
        if not isinstance(found, list):
            raise PermanentError(f"expected a JSON list of items, got {type(found).__name__}")
        if found:
            yield found
        if len(found) < limit:
            return
        offset += len(found)
    raise PermanentError(f"paging stopped after {max_pages} pages")


def next_link(response: httpx.Response) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header: where a listing goes on, and the position to
    resume it from."""
    link = response.links.get("next")
    return link.get("url") if link else None


def last_page(response: httpx.Response) -> int | None:
    """The page number of the ``rel="last"`` link (GitHub's way of saying how long a listing
    is), or None."""
    link = response.links.get("last")
    if not link or not link.get("url"):
        return None
    try:
        return int(httpx.URL(link["url"]).params["page"])
    except (KeyError, ValueError):
        return None


def _int_header(response: httpx.Response, name: str | None) -> int | None:
    if name is None:
        return None
    try:
        return int(response.headers[name])
    except (KeyError, ValueError):
        return None
