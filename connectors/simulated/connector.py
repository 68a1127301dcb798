"""Connectors for the simulated provider (``connectors.simulated.server``).

- ``simulated``: its project tracker. Two ``full`` tables, ``projects`` and ``issues``, paged by
  a ``Link`` header: every sync reads everything and the engine tombstones what disappeared.
  The listing is by page number, so it shifts when a row is deleted while it is read: a missing
  row is confirmed with the provider (``GET .../issues/ID``) before it is tombstoned.
- ``simulated_crm``: its CRM. ``contacts`` is ``full``, paged by a cursor in the body that is an
  offset (so it shifts too, and is confirmed the same way); ``deals`` is ``incremental``: the
  cursor is the provider's generation, and the change feed reports deletions explicitly; read
  from the start (no cursor yet) it is the whole table.
- ``simulated_docs``: its document store. ``files`` is ``full``, paged like the tracker, and
  holds files: each is scoped to its project and versioned by the SHA-256 of its content, and
  its content is downloaded from ``files/ID/content`` (a 302 to a download URL on another
  origin, followed without the token).

Every listing is resumable: the next link or cursor is the position a later attempt of the run
resumes from, and the tracker's ``X-Total-Count`` is the table's total.

Config: ``{"base_url": "http://127.0.0.1:8765", "tenant": "acme"}``; credentials:
``{"token": "sim-acme"}``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any, BinaryIO
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

from connectors.auth import BearerToken
from connectors.base import (
    Checkpoint,
    Connector,
    Deleted,
    Deletions,
    Item,
    Mode,
    Position,
    Resync,
    Table,
    Total,
)
from connectors.context import ConnectorContext
from connectors.credentials import TokenCredentials
from connectors.errors import FileGone, PermanentError
from connectors.files import Download, File
from connectors.http import HttpClient
from connectors.paging import cursor_pages, link_header_pages, next_link


class SimulatedConfig(BaseModel):
    """Where the simulated provider runs and which tenant (account) to read."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="The server's URL, as start_server() returned it.")
    tenant: str = Field(min_length=1, description="The tenant (account) to read.")
    page_size: int = Field(default=25, ge=1, le=500)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")


class _Simulated(Connector[SimulatedConfig]):
    config_model = SimulatedConfig
    credentials_model = TokenCredentials
    api: str

    def __init__(self, context: ConnectorContext[SimulatedConfig]) -> None:
        super().__init__(context)
        config = context.config
        self.config = config
        self.http = HttpClient(
            context,
            base_url=f"{config.base_url}/{self.api}/{config.tenant}/",
            auth=BearerToken(str(context.credentials.get("token") or "")),
        )

    @classmethod
    def budget_key(cls, config: SimulatedConfig, credentials: Mapping[str, Any]) -> str | None:
        # The simulated provider rate-limits per tenant, whichever API is called.
        return f"{config.base_url}/{config.tenant}"

    def close(self) -> None:
        self.http.close()

    def confirm_deleted(
        self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
    ) -> Collection[str]:
        """A row the listing did not show is gone if the provider answers 404 for it."""
        gone = []
        for key in missing:
            response = self.http.get(f"{table.name}/{key}", expect=(404,))
            if response.status_code == 404:
                gone.append(key)
        return gone


class _LinkPaged(_Simulated):
    """An API whose listings page by a ``Link`` header and count in ``X-Total-Count``."""

    def read(self, table: Table) -> Iterator[Item | list[Any]]:
        resumed = self.context.position(table.name)
        url, params = (
            (resumed["next"], None)
            if resumed
            else (table.name, {"per_page": self.config.page_size})
        )
        for response in link_header_pages(self.http, url, params=params):
            rows = self.http.json_of(response)
            if not isinstance(rows, list):
                raise PermanentError(f"{table.name}: expected a JSON list page")
            count = response.headers.get("x-total-count")
            if count is not None and count.isdigit():
                yield Total(int(count))
            yield rows
            following = next_link(response)
            if following is not None:
                yield Position({"next": following})


class SimulatedTracker(_LinkPaged):
    """The tracker API: ``projects`` and ``issues``, both read in full every sync."""

    provider = "simulated"
    api = "tracker"
    tables = (Table("projects", shifting=True), Table("issues", shifting=True))


class SimulatedDocs(_LinkPaged):
    """The document store: ``files``, read in full every sync, each row a file."""

    provider = "simulated_docs"
    api = "docs"
    tables = (Table("files", shifting=True, files=True),)

    @classmethod
    def describe_file(cls, table: Table, record: Mapping[str, Any]) -> File | None:
        if not record.get("name") or record.get("project_id") is None:
            raise PermanentError(f"file {record.get('id')} has no name or no project")
        return File(
            name=str(record["name"]),
            scope=f"project:{record['project_id']}",
            media_type=record.get("media_type"),
            size=record.get("size"),
            version=f"sha256:{record['sha256']}" if record.get("sha256") else None,
        )

    def download(
        self, table: Table, record: Mapping[str, Any], out: BinaryIO, *, max_bytes: int
    ) -> Download:
        # The path is built from the file's id, never a URL found in the record: the token goes
        # only to the provider's own origin.
        path = f"files/{quote(str(record.get('id') or ''), safe='')}/content"
        result = self.http.download(path, out, max_bytes=max_bytes, expect=(404,))
        if result.status == 404:
            raise FileGone(
                f"{record.get('name')} (file {record.get('id')}) was deleted; the next sync "
                "tombstones it"
            )
        return result


class SimulatedCrm(_Simulated):
    """The CRM API: ``contacts`` in full, ``deals`` incrementally from its change feed."""

    provider = "simulated_crm"
    api = "crm"
    tables = (
        Table("contacts", shifting=True),
        Table("deals", mode=Mode.INCREMENTAL, deletions=Deletions.FEED),
    )

    def read(self, table: Table) -> Iterator[Item | list[Item]]:
        resumed = self.context.position(table.name) or {}
        if table.name == "contacts":
            for body in self._pages("contacts", {}, resumed.get("cursor")):
                yield body["data"]
                if body.get("next_cursor"):
                    yield Position({"cursor": body["next_cursor"]})
            return
        if resumed:
            since = resumed.get("since")
        else:
            since = (self.context.cursor("deals") or {}).get("generation")
            if since is None:
                # From the start the feed lists every live deal: the whole table, so deals an
                # unfinished earlier sync wrote and the provider has deleted since are
                # tombstoned.
                yield Resync()
        params = {} if since is None else {"since": since}
        generation = None
        for body in self._pages("deals/changes", params, resumed.get("cursor")):
            generation = body.get("generation")
            yield [Deleted(str(row["id"])) if row.get("deleted") else row for row in body["data"]]
            if body.get("next_cursor"):
                yield Position({"cursor": body["next_cursor"], "since": since})
        if generation is not None:
            # Every change up to this generation is written: resume after it next time.
            yield Checkpoint({"generation": generation})

    def _pages(
        self, path: str, params: dict[str, Any], resume: str | None
    ) -> Iterator[dict[str, Any]]:
        for body in cursor_pages(
            self.http,
            path,
            cursor_param="cursor",
            next_cursor=lambda b: b.get("next_cursor") if isinstance(b, dict) else None,
            params={**params, "limit": self.config.page_size},
            start=resume,
        ):
            if not isinstance(body, dict) or not isinstance(body.get("data"), list):
                raise PermanentError(f"{path}: expected a JSON object with a `data` list")
            yield body
