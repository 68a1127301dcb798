"""Microsoft Graph drive items (SharePoint document libraries, OneDrive): one ``incremental``
table read with the delta query, each drive a partition (one that fails fails only its own
slice).

The first sync enumerates a drive from ``/drives/{drive_id}/root/delta``, following
``@odata.nextLink``, after a ``Resync``: the enumeration is the whole drive, so items an
unfinished earlier sync wrote and Graph deleted since are tombstoned. The last page carries
``@odata.deltaLink``, saved as the drive's cursor after that page's records are written. Later
syncs start from the saved delta link and get only changes. Deleted items come back with the
``deleted`` facet (drive items never use ``@removed``) and are tombstoned. A 410 Gone on a delta
link means the token cannot be used any more: the enumeration starts again (from the
``Location`` Graph sends, else from the start) after a ``Resync``, so rows not seen again are
tombstoned.

Within a run, each next link is the read position: an attempt that ends mid-enumeration (a
rate limit, a crash) is resumed by the next attempt of the same run from the last page it
wrote, and the engine remembers that the enumeration began with a ``Resync``. A next link is
never a cursor: a later run starts from the delta link, or from the start.

The table holds files (items with the ``file`` facet; folders, the root and packages are not
files). A file's version is the content hash Graph computes (``file.hashes``), else its
``cTag`` (changed by content only; OneDrive for Business leaves it out of delta responses),
else its ``eTag``. Its scope is its drive and parent folder *by id*: delta responses never
carry ``parentReference.path``, and renaming a folder does not list its descendants again, so
a path would go stale while the folder id does not; a file moved to another folder is listed
again with its new parent. Content comes from ``GET /drives/{drive-id}/items/{item-id}/content``,
which answers 302 with a pre-authenticated download URL on another host (SharePoint, or
``*.files.1drv.com``), followed without the access token. An item's
``@microsoft.graph.downloadUrl`` is never stored: it is such a URL itself, a credential that
also changes with every listing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, BinaryIO, Self
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator

from connectors.auth import OAuth2
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
)
from connectors.context import ConnectorContext
from connectors.credentials import OAuth2ClientCredentials
from connectors.errors import FileGone, PermanentError
from connectors.files import Download, File
from connectors.http import HttpClient
from connectors.paging import next_link_pages

GRAPH_SCOPE = "https://graph.microsoft.com/.default"

# Pre-authenticated download URLs (the OneDrive API's older name too): credentials, never stored.
DOWNLOAD_URL_KEYS = ("@microsoft.graph.downloadUrl", "@content.downloadUrl")
# The content hashes Graph computes, strongest first (SharePoint and OneDrive for Business give
# quickXorHash; OneDrive personal gives sha1Hash and sha256Hash as well).
CONTENT_HASHES = ("sha256Hash", "sha1Hash", "quickXorHash", "crc32Hash")

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class GraphDriveConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: Identifier
    drive_id: Identifier | None = None
    drive_ids: list[Identifier] = []
    base_url: str = "https://graph.microsoft.com/v1.0"
    token_url: str = "https://login.microsoftonline.com/{tenant_id}/oauth2/v2.0/token"
    scope: str = GRAPH_SCOPE

    @model_validator(mode="after")
    def _some_drive(self) -> Self:
        if not self.drives:
            raise ValueError("name a drive: drive_id, or drive_ids for several")
        return self

    @property
    def drives(self) -> list[str]:
        """Every drive to read, each once, in order."""
        listed = [self.drive_id, *self.drive_ids] if self.drive_id else self.drive_ids
        return list(dict.fromkeys(listed))


def file_version(record: Mapping[str, Any]) -> str | None:
    """What changes when a drive item's content changes (pure): a content hash Graph computed,
    else the ``cTag``, else the ``eTag`` (which changes with metadata too)."""
    facet = record.get("file")
    hashes = facet.get("hashes") if isinstance(facet, Mapping) else None
    if isinstance(hashes, Mapping):
        for name in CONTENT_HASHES:
            if hashes.get(name):
                return f"{name}:{hashes[name]}"
    for tag in ("cTag", "eTag"):
        if record.get(tag):
            return str(record[tag])
    return None


class _DeltaGone(Exception):
    """Graph answered 410 Gone: the delta or next link is no longer valid."""

    def __init__(self, location: str | None, code: str) -> None:
        super().__init__(code)
        self.location = location
        self.code = code


def resync_code(response: httpx.Response) -> str:
    """The error code of a 410 (``resyncRequired``, ``resyncChangesApplyDifferences``, ...), for
    the log (pure)."""
    try:
        error = response.json().get("error") or {}
        return str(error.get("code") or "gone")
    except (ValueError, AttributeError):
        return "gone"


class GraphDriveConnector(Connector[GraphDriveConfig]):
    provider = "msgraph_drive"
    tables = (Table("drive_items", "id", Mode.INCREMENTAL, deletions=Deletions.FEED, files=True),)
    config_model = GraphDriveConfig
    credentials_model = OAuth2ClientCredentials

    def __init__(self, context: ConnectorContext[GraphDriveConfig]) -> None:
        super().__init__(context)
        config = context.config
        self.config = config
        self._http = HttpClient(
            context,
            base_url=config.base_url.rstrip("/"),
            auth=OAuth2(
                context,
                token_url=config.token_url.replace("{tenant_id}", quote(config.tenant_id, safe="")),
                grant="client_credentials",
                scope=config.scope,
            ),
            on_response=self._raise_if_gone,
        )

    @classmethod
    def budget_key(cls, config: GraphDriveConfig, credentials: Mapping[str, Any]) -> str | None:
        # Graph throttles SharePoint/OneDrive per app per tenant: connections of one app in one
        # tenant share a budget, other apps or tenants do not.
        app = str(credentials.get("client_id") or "")
        return f"tenant:{config.tenant_id.lower()}/app:{app}"

    def partitions(self, table: Table) -> list[str]:
        return self.config.drives

    def read_partition(self, table: Table, partition: str) -> Iterator[Item | list[Item]]:
        start = f"/drives/{quote(partition, safe='!')}/root/delta"
        resumed = self.context.position(table.name, partition)
        if resumed:
            url = resumed["next"]
        else:
            url = self._delta_link(table, partition) or start
            if url == start:
                # From the start, the enumeration is the whole drive: items an unfinished
                # earlier sync wrote and Graph has deleted since are tombstoned.
                yield Resync()
        resynced = False
        while True:
            try:
                yield from self._enumerate(url, partition)
                return
            except _DeltaGone as gone:
                if resynced:
                    raise PermanentError(
                        f"Microsoft Graph answered 410 Gone ({gone.code}) again right after a "
                        "resync; the drive cannot be enumerated now"
                    ) from None
                resynced = True
                self.context.logger.warning(
                    "the delta link is no longer valid (%s): enumerating the drive again",
                    gone.code,
                )
                # Everything that follows is the whole drive: rows not seen again are deleted.
                yield Resync()
                url = self._same_host(gone.location) or start

    def _delta_link(self, table: Table, drive: str) -> str | None:
        saved = self.context.cursor(table.name, drive) or {}
        if not saved and drive == self.config.drives[0]:
            # Saved before drives were partitions: the one drive's link, at the top.
            saved = self.context.cursor(table.name) or {}
        link = saved.get("delta_link") if isinstance(saved, Mapping) else None
        return str(link) if link else None

    def _enumerate(self, url: str, drive: str) -> Iterator[Item | list[Item]]:
        delta_link: str | None = None
        for page in next_link_pages(self._http, url):
            items = page.get("value")
            if not isinstance(items, list):
                raise PermanentError("a delta page has no `value` list")
            yield [self._item(item) for item in items]
            delta_link = page.get("@odata.deltaLink")
            if page.get("@odata.nextLink"):
                yield Position({"next": page["@odata.nextLink"]})
        if not delta_link:
            raise PermanentError("the delta enumeration ended without an @odata.deltaLink")
        yield Checkpoint({"delta_link": delta_link}, partition=drive)

    @staticmethod
    def _item(item: Any) -> Item:
        # The `deleted` facet, present (even `{}`) means deleted; absent or null means not.
        if isinstance(item, Mapping) and item.get("deleted") is not None:
            if not item.get("id"):
                raise PermanentError("a deleted drive item has no id")
            return Deleted(str(item["id"]))
        if isinstance(item, Mapping) and any(key in item for key in DOWNLOAD_URL_KEYS):
            return {k: v for k, v in item.items() if k not in DOWNLOAD_URL_KEYS}
        return item

    @classmethod
    def describe_file(cls, table: Table, record: Mapping[str, Any]) -> File | None:
        facet = record.get("file")
        if not isinstance(facet, Mapping):
            return None  # a folder, the root, a package (a OneNote notebook)
        item = record.get("id")
        parent = record.get("parentReference")
        drive = parent.get("driveId") if isinstance(parent, Mapping) else None
        if not record.get("name") or not drive:
            raise PermanentError(f"drive item {item} has a file facet but no name or driveId")
        folder = parent.get("id") if isinstance(parent, Mapping) else None
        size = record.get("size")
        return File(
            name=str(record["name"]),
            scope=f"drive:{drive}/folder:{folder}" if folder else f"drive:{drive}",
            media_type=str(facet["mimeType"]) if facet.get("mimeType") else None,
            size=size if isinstance(size, int) and size >= 0 else None,
            version=file_version(record),
        )

    def download(
        self, table: Table, record: Mapping[str, Any], out: BinaryIO, *, max_bytes: int
    ) -> Download:
        described = self.describe_file(table, record)
        if described is None:
            raise PermanentError(f"drive item {record.get('id')} is not a file")
        drive = record["parentReference"]["driveId"]
        item = str(record.get("id") or "")
        url = f"/drives/{quote(drive, safe='!')}/items/{quote(item, safe='!')}/content"
        gone = FileGone(
            f"{described.name} (drive item {item}) is no longer in the drive; the next sync "
            "tombstones it"
        )
        try:
            # 302 to a pre-authenticated URL on another host: followed without the token.
            result = self._http.download(url, out, max_bytes=max_bytes, expect=(404,))
        except _DeltaGone:
            raise gone from None
        if result.status == 404:
            raise gone
        return result

    def _same_host(self, location: str | None) -> str | None:
        """The 410's Location, if it points at the Graph host we call: the access token goes
        wherever we follow it."""
        if not location:
            return None
        base = httpx.URL(self.config.base_url)
        target = httpx.URL(location)
        return location if (target.scheme, target.host) == (base.scheme, base.host) else None

    def close(self) -> None:
        self._http.close()

    @staticmethod
    def _raise_if_gone(response: httpx.Response) -> None:
        if response.status_code == 410:
            raise _DeltaGone(response.headers.get("location"), resync_code(response))
