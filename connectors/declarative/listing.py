"""A listing page by page, whatever its paginator: each paginator of a provider file runs on the
SDK's page loop for it (``connectors.paging``), and every page says where the listing goes on
after it, so a later attempt can resume there."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from connectors.declarative.spec import (
    Cursor,
    LinkHeader,
    NextUrl,
    Offset,
    PageNumber,
    PaginatorSpec,
    Single,
)
from connectors.declarative.templates import as_text, dig
from connectors.errors import PermanentError
from connectors.http import HttpClient
from connectors.paging import (
    cursor_pages,
    link_header_pages,
    next_link,
    next_link_pages,
    offset_pages,
    page_number_pages,
)


@dataclass(frozen=True)
class Page:
    records: list[dict[str, Any]]
    body: Any
    next: dict[str, Any] | None
    """Where the listing goes on after this page (a read position); None after the last."""


@dataclass(frozen=True)
class Request:
    """The first request of a listing."""

    url: str
    params: Mapping[str, Any]
    records: str | None  # where the records are in a body; None: the body is the list
    conditional: bool = False


def pages(
    http: HttpClient,
    paginator: PaginatorSpec | None,
    request: Request,
    resume: Mapping[str, Any] | None,
) -> Iterator[Page]:
    """The pages of a listing, from its start or from ``resume`` (a page's ``next``)."""
    match paginator:
        case LinkHeader():
            yield from _link_header(http, request, resume)
        case NextUrl():
            yield from _next_url(http, paginator, request, resume)
        case Cursor():
            yield from _cursor(http, paginator, request, resume)
        case Offset():
            yield from _offset(http, paginator, request, resume)
        case PageNumber():
            yield from _page_number(http, paginator, request, resume)
        case Single() | None:
            body = http.get_json(request.url, params=request.params)
            yield Page(records_of(body, request.records), body, None)


def _link_header(
    http: HttpClient, request: Request, resume: Mapping[str, Any] | None
) -> Iterator[Page]:
    url, params = (resume["next"], None) if resume else (request.url, request.params)
    for response in link_header_pages(http, url, params=params, conditional=request.conditional):
        body = http.json_of(response)
        following = next_link(response)
        yield Page(records_of(body, request.records), body, _at("next", following))


def _next_url(
    http: HttpClient, paginator: NextUrl, request: Request, resume: Mapping[str, Any] | None
) -> Iterator[Page]:
    url, params = (resume["next"], None) if resume else (request.url, request.params)

    def following(body: dict[str, Any]) -> str | None:
        found = dig(body, paginator.path)
        return as_text(found) if found else None

    for body in next_link_pages(
        http, url, params=params, next_url=following, conditional=request.conditional
    ):
        yield Page(records_of(body, request.records), body, _at("next", following(body)))


def _cursor(
    http: HttpClient, paginator: Cursor, request: Request, resume: Mapping[str, Any] | None
) -> Iterator[Page]:
    def following(body: Any) -> str | None:
        found = dig(body, paginator.path)
        return as_text(found) if found not in (None, "") else None

    for body in cursor_pages(
        http,
        request.url,
        cursor_param=paginator.param,
        next_cursor=following,
        params=request.params,
        start=resume["cursor"] if resume else None,
        conditional=request.conditional,
    ):
        yield Page(records_of(body, request.records), body, _at("cursor", following(body)))


def _offset(
    http: HttpClient, paginator: Offset, request: Request, resume: Mapping[str, Any] | None
) -> Iterator[Page]:
    offset = int(resume["offset"]) if resume else 0
    for found in offset_pages(
        http,
        request.url,
        params=request.params,
        offset_param=paginator.param,
        limit_param=paginator.limit_param,
        limit=paginator.limit,
        start=offset,
        items=lambda body: records_of(body, request.records),
        conditional=request.conditional,
    ):
        offset += len(found)
        more = len(found) >= paginator.limit
        yield Page(found, None, {"offset": offset} if more else None)


def _page_number(
    http: HttpClient, paginator: PageNumber, request: Request, resume: Mapping[str, Any] | None
) -> Iterator[Page]:
    page = int(resume["page"]) if resume else paginator.first
    for found in page_number_pages(
        http,
        request.url,
        params=request.params,
        page_param=paginator.param,
        size_param=paginator.size_param,
        size=paginator.size,
        first=page,
        items=lambda body: records_of(body, request.records),
        total_header=paginator.total_header,
        conditional=request.conditional,
    ):
        page += 1
        more = len(found) >= paginator.size
        yield Page(found, None, {"page": page} if more else None)


def _at(key: str, value: str | None) -> dict[str, Any] | None:
    return {key: value} if value else None


def records_of(body: Any, path: str | None) -> list[dict[str, Any]]:
    """The records of a page: the body, or the list at ``path`` in it."""
    found = body if path is None else dig(body, path)
    if found is None and path is not None and isinstance(body, Mapping):
        return []  # a page without the key holds no records (an empty last page)
    if not isinstance(found, list):
        where = "the body" if path is None else f"`{path}` of the body"
        raise PermanentError(f"expected a list of records in {where}, got {type(found).__name__}")
    for record in found:
        if not isinstance(record, Mapping):
            raise PermanentError(f"expected records (JSON objects), got {type(record).__name__}")
    return found
