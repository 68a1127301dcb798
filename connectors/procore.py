"""Procore: a company's companies and projects (``full``), and the RFIs of each project
(``incremental``, each project a partition: one that fails fails only its own slice).

Every table is listed completely at every sync, so an RFI moved to the recycle bin or deleted
upstream is tombstoned by the next sync, and so are the RFIs of a project that leaves the
company's listing of active projects (it is a partition no longer listed). RFIs also save, per
project, the end of the time range read: an operator who sets ``complete_every`` for them
(trading deletion latency for requests) gets syncs that list only the RFIs updated since, with
``filters[updated_at]=SINCE...NOW`` (the fixed end keeps items updated during the read out of
it), between complete listings.

Procore lists by page number, so a listing shifts when an item is deleted while it is read: all
three tables are ``shifting``. A project or RFI missing from a complete listing is confirmed
with its show endpoint (``GET /rest/v1.0/projects/{id}``, ``.../projects/{id}/rfis/{id}``: a 404
or 410 is gone, and so is a project shown inactive or an RFI shown deleted; any other 200 is
still there) before it is tombstoned; companies have no show endpoint, so a
company is tombstoned once two complete listings missed it. The page number is the position a
later attempt resumes from, and ``Total`` gives the total.

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

from collections.abc import Collection, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from connectors.auth import OAuth2
from connectors.base import (
    Checkpoint,
    Connector,
    Item,
    Mode,
    Position,
    Resync,
    Table,
    Total,
)
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


class ProcoreConnector(Connector[ProcoreConfig]):
    provider = "procore"
    tables = (
        Table("companies", shifting=True),
        Table("projects", shifting=True),
        Table("rfis", mode=Mode.INCREMENTAL, shifting=True),
    )
    config_model = ProcoreConfig
    credentials_model = OAuth2RefreshCredentials

    def __init__(self, context: ConnectorContext[ProcoreConfig]) -> None:
        super().__init__(context)
        config = context.config
        self.config = config
        self._http = HttpClient(
            context,
            base_url=config.base_url.rstrip("/"),
            auth=OAuth2(context, token_url=config.token_url, grant="refresh_token"),
            headers={"Procore-Company-Id": str(config.company_id)},
            on_response=self._note_budget,
            classify_response=classify_procore,
        )
        # The projects this run listed: the partitions of `rfis`, without listing them again.
        self._project_ids: list[str] | None = None

    @classmethod
    def budget_key(cls, config: ProcoreConfig, credentials: Mapping[str, Any]) -> str | None:
        # Procore counts requests per OAuth app (client id): every connection of one app, for
        # any company or user, draws on it.
        app = str(credentials.get("client_id") or "")
        return f"app:{config.base_url}/{app}" if app else None

    def read(self, table: Table) -> Iterator[Item | list[Item]]:
        if table.name == "companies":
            yield from self._pages(table, None, "/rest/v1.0/companies", {})
        elif table.name == "projects":
            listed: list[str] = []
            params = {"company_id": self.config.company_id}
            for page in self._pages(table, None, "/rest/v1.0/projects", params):
                if isinstance(page, list):
                    listed.extend(_project_id(p) for p in page if isinstance(p, Mapping))
                yield page
            if self.context.position(table.name) is None:  # a listing read whole
                self._project_ids = listed
        else:  # pragma: no cover - the engine only asks for declared tables
            raise PermanentError(f"unknown table {table.name!r}")

    def partitions(self, table: Table) -> list[str] | None:
        if table.name != "rfis":
            return None
        if self._project_ids is None:
            ids: list[str] = []
            params = {"company_id": self.config.company_id}
            for page in self._pages(None, None, "/rest/v1.0/projects", params):
                if isinstance(page, list):
                    ids.extend(_project_id(p) for p in page if isinstance(p, Mapping))
            self._project_ids = ids
        return self._project_ids

    def read_partition(self, table: Table, partition: str) -> Iterator[Item | list[Item]]:
        path = f"/rest/v1.0/projects/{partition}/rfis"
        resumed = self.context.position(table.name, partition)
        if resumed:
            since, until = resumed.get("since"), resumed["until"]
        else:
            since = (self.context.cursor(table.name, partition) or {}).get("since")
            until = _now_iso()
            if since is None:
                # No cursor: every RFI of the project (every sync, unless an operator's
                # complete_every says only what changed is read until the next complete pass).
                yield Resync()
        params = {} if since is None else {"filters[updated_at]": f"{since}...{until}"}
        window = {"since": since, "until": until}
        for page in self._pages(table, partition, path, params, extra=window):
            if isinstance(page, list):
                # An RFI does not name its project; keep the link for joins.
                yield [
                    {**rfi, "project_id": int(partition)}
                    for rfi in page
                    if isinstance(rfi, Mapping)
                ]
            else:
                yield page
        yield Checkpoint({"since": until}, partition=partition)

    def confirm_deleted(
        self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
    ) -> Collection[str] | None:
        """Ask Procore for each missing project or RFI: 404 or 410 is gone, and so is a project
        shown inactive (the listing holds active projects only) or an RFI shown deleted (in the
        recycle bin); any other 200 is still there. Companies have no show endpoint: None (two
        complete listings decide)."""
        if table.name == "companies":
            return None
        gone = []
        for key in missing:
            if table.name == "projects":
                url, params = f"/rest/v1.0/projects/{key}", {"company_id": self.config.company_id}
            else:
                url, params = f"/rest/v1.0/projects/{partition}/rfis/{key}", {}
            response = self._http.get(url, params=params, expect=(404, 410))
            if response.status_code in (404, 410) or _out_of_scope(self._http.json_of(response)):
                gone.append(key)
        return gone

    def _pages(
        self,
        table: Table | None,
        partition: str | None,
        path: str,
        params: Mapping[str, Any],
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> Iterator[Item | list[Item]]:
        """The items of a list endpoint, one page at a time, each followed by the position of
        the next page (``extra`` rides along in it); from the page an earlier attempt of the run
        reached, if it did."""
        per_page = self.config.per_page
        resumed = self.context.position(table.name, partition) if table else None
        first = int(resumed["page"]) if resumed else 1
        fetched = (first - 1) * per_page
        previous: tuple[Any, ...] | None = None
        for page in range(first, MAX_PAGES + 1):
            response = self._http.get(path, params={**params, "page": page, "per_page": per_page})
            items = self._http.json_of(response)
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise PermanentError(f"GET {path}: expected a JSON list of objects")
            total = _int_header(response, "total")
            if total is not None:
                yield Total(total)
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
            yield Position({"page": page + 1, **(extra or {})})
        raise PermanentError(f"GET {path}: paging stopped after {MAX_PAGES} pages")

    def close(self) -> None:
        self._http.close()

    def _note_budget(self, response: httpx.Response) -> None:
        if response.is_success:
            until = spent_until(response, datetime.now(UTC))
            if until is not None:
                self.context.report_rate_limit(until, "Procore X-Rate-Limit-Remaining reached 0")


def _out_of_scope(shown: Any) -> bool:
    """A project or RFI Procore still shows, but that its listing no longer holds: an inactive
    project, a recycled (deleted) RFI (pure)."""
    if not isinstance(shown, Mapping):
        return False
    return shown.get("active") is False or bool(shown.get("deleted_at"))


def _project_id(project: Mapping[str, Any]) -> str:
    project_id = project.get("id")
    if not isinstance(project_id, int):
        raise PermanentError(f"a project has no integer id: {project_id!r}")
    return str(project_id)


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
