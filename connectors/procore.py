"""Procore: a company's companies, projects and the RFIs of each project, all ``full`` tables.

Auth is the OAuth2 authorization-code flow. Procore rotates refresh tokens (each refresh returns
a new one and the old one stops working), so every refresh goes through the engine's
``refresh_credentials``, which spends the stored refresh token under the connection's lock and
saves the new pair in the same transaction.

Every request carries ``Procore-Company-Id`` (Procore scopes data per company). Lists are read
page by page with ``page`` / ``per_page``; Procore's ``Link`` header says whether a next page
exists, and ``Total`` / ``Per-Page`` answer it when an endpoint sends no ``Link``. We ask for
page numbers rather than following the ``Link`` URLs because Procore's links carry only
``page`` and ``per_page``, not the filters of the request (``company_id``).

Rate limits: a 429 waits until ``X-Rate-Limit-Reset`` (Unix seconds) unless it names a
``Retry-After``; a response with ``X-Rate-Limit-Remaining: 0`` spends the shared budget until the
reset, so the next request waits (or the run is requeued at the reset).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from connectors.auth import OAuth2
from connectors.base import Connector, Table
from connectors.context import ConnectorContext
from connectors.credentials import OAuth2RefreshCredentials
from connectors.errors import PermanentError
from connectors.http import HttpClient
from connectors.http_policy import (
    Classification,
    Verdict,
    parse_reset_epoch,
    parse_retry_after,
)

MAX_PAGES = 100_000


class ProcoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    company_id: int = Field(gt=0)
    base_url: str = "https://api.procore.com"
    token_url: str = "https://login.procore.com/oauth/token"
    # Procore recommends at most 2,000; 100 keeps each page (and a retry of it) small.
    per_page: int = Field(default=100, ge=1, le=2000)


def classify_procore(response: httpx.Response, now: datetime) -> Classification | None:
    """Procore's 429: its wait is the ``X-Rate-Limit-Reset`` epoch (pure). A ``Retry-After``,
    if sent, wins; other responses keep the standard classification."""
    if response.status_code != 429:
        return None
    raw = response.headers.get("retry-after")
    if raw is not None:
        wait = parse_retry_after(raw, now)
        if wait is not None:
            return Classification(Verdict.RATE_LIMITED, wait)
    wait = parse_reset_epoch(response.headers.get("x-rate-limit-reset"), now)
    return Classification(Verdict.RATE_LIMITED, wait)


def spent_until(response: httpx.Response, now: datetime) -> datetime | None:
    """When the budget a successful response used up is free again; None if some is left
    (pure)."""
    if response.headers.get("x-rate-limit-remaining", "").strip() != "0":
        return None
    wait = parse_reset_epoch(response.headers.get("x-rate-limit-reset"), now)
    return None if wait is None else now + timedelta(seconds=wait)


def has_next_page(response: httpx.Response, items: int, fetched: int, per_page: int) -> bool:
    """Whether another page follows this one (pure). Procore omits ``rel="next"`` on the last
    page; without a ``Link`` header, ``Total`` and a full page decide."""
    if "link" in response.headers:
        return "next" in response.links
    if items == 0 or items < (_int_header(response, "per-page") or per_page):
        return False
    total = _int_header(response, "total")
    return total is None or fetched < total


def _int_header(response: httpx.Response, name: str) -> int | None:
    try:
        return int(response.headers[name])
    except (KeyError, ValueError):
        return None


class ProcoreConnector(Connector):
    provider = "procore"
    tables = (Table("companies"), Table("projects"), Table("rfis"))
    config_model = ProcoreConfig
    credentials_model = OAuth2RefreshCredentials

    def __init__(self, context: ConnectorContext) -> None:
        super().__init__(context)
        config = context.config
        assert isinstance(config, ProcoreConfig)
        self.config = config
        self._http = HttpClient(
            context,
            base_url=config.base_url.rstrip("/"),
            auth=OAuth2(context, token_url=config.token_url, grant="refresh_token"),
            headers={"Procore-Company-Id": str(config.company_id)},
            on_response=self._note_budget,
            classify_response=classify_procore,
        )

    @classmethod
    def budget_key(cls, config: BaseModel, credentials: Mapping[str, Any]) -> str | None:
        # Procore counts requests per OAuth app (client id): every connection of one app, for
        # any company or user, draws on it.
        assert isinstance(config, ProcoreConfig)
        app = str(credentials.get("client_id") or "")
        return f"app:{config.base_url}/{app}" if app else None

    def read(self, table: Table) -> Iterator[Sequence[Mapping[str, Any]]]:
        if table.name == "companies":
            yield from self._pages("/rest/v1.0/companies", {})
        elif table.name == "projects":
            yield from self._pages("/rest/v1.0/projects", {"company_id": self.config.company_id})
        elif table.name == "rfis":
            for projects in self._pages(
                "/rest/v1.0/projects", {"company_id": self.config.company_id}
            ):
                for project in projects:
                    project_id = project.get("id")
                    if not isinstance(project_id, int):
                        raise PermanentError(f"a project has no integer id: {project_id!r}")
                    for rfis in self._pages(f"/rest/v1.0/projects/{project_id}/rfis", {}):
                        # An RFI does not name its project; keep the link for joins.
                        yield [{**rfi, "project_id": project_id} for rfi in rfis]
        else:  # pragma: no cover - the engine only asks for declared tables
            raise PermanentError(f"unknown table {table.name!r}")

    def _pages(self, path: str, params: Mapping[str, Any]) -> Iterator[list[dict[str, Any]]]:
        """The items of a list endpoint, one page at a time."""
        per_page = self.config.per_page
        fetched = 0
        previous: tuple[Any, ...] | None = None
        for page in range(1, MAX_PAGES + 1):
            response = self._http.get(path, params={**params, "page": page, "per_page": per_page})
            items = self._http.json_of(response)
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise PermanentError(f"GET {path}: expected a JSON list of objects")
            if items:
                # A server that ignores `page` sends the same page forever and says "next".
                marker = (len(items), items[0].get("id"), items[-1].get("id"))
                if marker == previous:
                    raise PermanentError(
                        f"paging loop: GET {path} page {page} repeats page {page - 1}"
                    )
                previous = marker
                yield items
            fetched += len(items)
            if not has_next_page(response, len(items), fetched, per_page):
                return
        raise PermanentError(f"GET {path}: paging stopped after {MAX_PAGES} pages")

    def close(self) -> None:
        self._http.close()

    def _note_budget(self, response: httpx.Response) -> None:
        if response.is_success:
            until = spent_until(response, datetime.now(UTC))
            if until is not None:
                self.context.report_rate_limit(until, "Procore X-Rate-Limit-Remaining reached 0")
