"""A stateful stand-in for Microsoft Graph's drive API and the identity platform's token
endpoint, answering as their docs say: client-credentials tokens; ``/drives/{id}/root/delta``
enumerating the drive page by page with ``@odata.nextLink``, its last page carrying
``@odata.deltaLink``, and a delta link answering the changes since it was given, deleted items
with the ``deleted`` facet; ``/drives/{id}/items/{id}/content`` answering 302 with a
pre-authenticated download URL (a ``tempauth`` in its query, no token needed), which serves the
bytes."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx

TENANT = "contoso.onmicrosoft.com"
DRIVE = "b!drive-engineering"
CLIENT = {"client_id": "0f8b3a6c-2d4e-4b8a-9c1d-5e7f9a1b3c5d", "client_secret": "graph~secret~1"}
PAGE = 50


@dataclass
class Item:
    id: str
    name: str
    content: bytes
    changed: int  # the change sequence number it was last changed at
    deleted: bool = False

    def as_listed(self) -> dict[str, Any]:
        if self.deleted:
            return {"id": self.id, "deleted": {"state": "deleted"},
                    "parentReference": {"driveId": DRIVE}}  # fmt: skip
        digest = hashlib.sha1(self.content).hexdigest().upper()
        return {
            "@odata.type": "#microsoft.graph.driveItem",
            "id": self.id,
            "name": self.name,
            "size": len(self.content),
            "eTag": f'"{{{self.id}}},{self.changed}"',
            "cTag": f'"c:{{{self.id}}},{self.changed}"',
            "file": {"mimeType": "text/plain", "hashes": {"sha1Hash": digest}},
            "parentReference": {"driveId": DRIVE, "id": "root-id"},
        }


class Graph:
    def __init__(self) -> None:
        self.base = ""  # the server's address, set once it is served
        self.items: dict[str, Item] = {}
        self.sequence = 0
        self._lock = threading.Lock()
        self._tokens: set[str] = set()

    def add(self, count: int, words: int = 400) -> None:
        for _ in range(count):
            self.sequence += 1
            n = len(self.items) + 1
            text = " ".join(f"word{(n * 7 + w) % 997}" for w in range(words))
            self.items[f"item-{n:04d}"] = Item(
                f"item-{n:04d}", f"notes-{n:04d}.txt", text.encode(), self.sequence
            )

    def delete(self, item_id: str) -> None:
        self.sequence += 1
        item = self.items[item_id]
        item.deleted, item.changed = True, self.sequence

    def config(self) -> dict[str, Any]:
        return {
            "tenant_id": TENANT,
            "drive_id": DRIVE,
            "base_url": f"{self.base}/v1.0",
            "token_url": f"{self.base}/{{tenant_id}}/oauth2/v2.0/token",
        }

    # -- answering ---------------------------------------------------------------------------

    def answer(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            return self._answer(request)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/oauth2/v2.0/token"):
            form = parse_qs(request.content.decode())
            if form.get("client_secret") != [CLIENT["client_secret"]]:
                return httpx.Response(401, json={"error": "invalid_client"})
            token = f"graph-token-{len(self._tokens)}"
            self._tokens.add(token)
            body = {"token_type": "Bearer", "expires_in": 3599, "access_token": token}
            return httpx.Response(200, json=body)
        if path.startswith("/download/"):
            item = self.items.get(path.removeprefix("/download/"))
            if item is None or item.deleted or "tempauth" not in request.url.params:
                return httpx.Response(404)
            return httpx.Response(200, content=item.content, headers={"content-type": "text/plain"})
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in self._tokens:
            return _error(401, "InvalidAuthenticationToken", "Access token is empty.")
        prefix = f"/v1.0/drives/{DRIVE}"
        if path == f"{prefix}/root/delta":
            return self._delta(request)
        if path.startswith(f"{prefix}/items/") and path.endswith("/content"):
            item = self.items.get(path.removeprefix(f"{prefix}/items/").removesuffix("/content"))
            if item is None or item.deleted:
                return _error(404, "itemNotFound", "The resource could not be found.")
            where = f"{self.base}/download/{item.id}?tempauth=v1.{item.id}.{item.changed}"
            return httpx.Response(302, headers={"location": where})
        return _error(404, "itemNotFound", "The resource could not be found.")

    def _delta(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        since = int(params.get("since", "0"))  # what a delta link carries
        skip = int(params.get("skip", "0"))  # what a next link carries
        changed = [i for i in self.items.values() if i.changed > since]
        if since == 0:
            changed = [i for i in changed if not i.deleted]
        changed.sort(key=lambda i: (i.changed, i.id))
        page = changed[skip : skip + PAGE]
        body: dict[str, Any] = {"value": [i.as_listed() for i in page]}
        link = f"{self.base}/v1.0/drives/{DRIVE}/root/delta"
        if skip + PAGE < len(changed):
            body["@odata.nextLink"] = f"{link}?since={since}&skip={skip + PAGE}"
        else:
            body["@odata.deltaLink"] = f"{link}?since={self.sequence}"
        return httpx.Response(200, json=body)


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})
