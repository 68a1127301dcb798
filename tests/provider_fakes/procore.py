"""A stateful stand-in for Procore's REST API and its OAuth2 token endpoint, answering as
Procore's docs say: lists paged by ``page``/``per_page`` with ``Total``, ``Per-Page`` and a
``Link`` header that carries only the page; the company's projects listing holds its active
projects only; RFIs listed per project (those moved to the recycle bin left out), filtered by
``filters[updated_at]=FROM...TO``; a project or an RFI by id (404 once deleted or recycled);
``X-Rate-Limit-*`` headers on every answer; refresh tokens that rotate (a spent one is refused
with ``invalid_grant``); every request carries ``Procore-Company-Id``."""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx

from tests.connectors.helpers import fixture

CLIENT = {
    "client_id": "5c8f3b1a9e2d4c6b8a0f1e3d5c7b9a2e4f6d8c0b1a3e5f7d9c2b4a6e8f0d1c3b",
    "client_secret": "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
}
RATE_LIMIT = {"X-Rate-Limit-Limit": "3600", "X-Rate-Limit-Remaining": "3500",
              "X-Rate-Limit-Reset": "4102444800"}  # fmt: skip


def make_rfi(rfi_id: int, *, updated_at: str = "2024-05-06T09:00:00Z") -> dict[str, Any]:
    rfi = copy.deepcopy(fixture("procore", "rfis_1100417.json")[0])
    rfi.update(id=rfi_id, number=str(rfi_id % 1000), subject=f"RFI {rfi_id}", updated_at=updated_at)
    return rfi


@dataclass
class Project:
    id: int
    active: bool = True
    rfis: dict[int, dict[str, Any]] = field(default_factory=dict)
    recycled: set[int] = field(default_factory=set)

    def shown(self) -> dict[str, Any]:
        body = copy.deepcopy(fixture("procore", "projects_page1.json")[0])
        body.update(id=self.id, name=f"Project {self.id}", active=self.active)
        return body


class Procore:
    def __init__(self, company_id: int = 8089) -> None:
        self.company_id = company_id
        self.projects: dict[int, Project] = {}
        self._lock = threading.Lock()
        self._tokens = {"at-0"}
        self._refresh: set[str] = set()
        self.issued = 0

    def project(self, project_id: int, rfis: int = 0) -> Project:
        found = self.projects.setdefault(project_id, Project(project_id))
        for n in range(rfis):
            rfi_id = project_id * 1000 + n
            found.rfis[rfi_id] = make_rfi(rfi_id)
        return found

    def credentials(self) -> dict[str, Any]:
        """A new authorization of the app: its own refresh token."""
        with self._lock:
            token = f"rt-authorized-{len(self._refresh)}-{self.issued}"
            self._refresh.add(token)
        return {**CLIENT, "refresh_token": token}

    # -- answering ---------------------------------------------------------------------------

    def answer(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            return self._answer(request)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/oauth/token":
            return self._token(request)
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in self._tokens:
            return _json({"errors": "Unauthorized"}, 401)
        if request.headers.get("procore-company-id") != str(self.company_id):
            return _json({"errors": "Procore-Company-Id is missing or wrong"}, 400)
        parts = path.removeprefix("/rest/v1.0/").split("/")
        params = request.url.params
        if parts == ["companies"]:
            companies = fixture("procore", "companies.json")
            return _page(request, [c for c in companies if c["id"] == self.company_id])
        if parts == ["projects"]:
            active = [p.shown() for p in sorted(self.projects.values(), key=lambda p: p.id)]
            return _page(request, [p for p in active if p["active"]])
        project = self.projects.get(int(parts[1])) if len(parts) > 1 else None
        if project is None:
            return _json({"errors": "404 Not Found"}, 404)
        if len(parts) == 2:
            return _json(project.shown(), 200)
        rfis = [r for i, r in sorted(project.rfis.items()) if i not in project.recycled]
        if len(parts) == 3:
            window = params.get("filters[updated_at]")
            if window:
                since, until = window.split("...")
                rfis = [r for r in rfis if since <= r["updated_at"] <= until]
            return _page(request, rfis)
        found = next((r for r in rfis if str(r["id"]) == parts[3]), None)
        return _json(found, 200) if found else _json({"errors": "404 Not Found"}, 404)

    def _token(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        spent = form.get("refresh_token", [""])[0]
        if form.get("client_id") != [CLIENT["client_id"]] or spent not in self._refresh:
            return _json(fixture("procore", "invalid_grant.json"), 400)
        self._refresh.discard(spent)
        self.issued += 1
        body = {**fixture("procore", "token.json"), "access_token": f"at-{self.issued}"}
        body["refresh_token"] = f"rt-{self.issued}"
        self._tokens.add(body["access_token"])
        self._refresh.add(body["refresh_token"])
        return _json(body, 200)


def _page(request: httpx.Request, items: list[dict[str, Any]]) -> httpx.Response:
    params = request.url.params
    page, per_page = int(params.get("page", "1")), int(params.get("per_page", "100"))
    last = max(math.ceil(len(items) / per_page), 1)
    headers = {"Total": str(len(items)), "Per-Page": str(per_page)}
    url = request.url.copy_with(query=None)
    if last > 1:
        rels = []
        if page > 1:
            rels.append(f'<{url}?page={page - 1}&per_page={per_page}>; rel="prev"')
        if page < last:
            rels.append(f'<{url}?page={page + 1}&per_page={per_page}>; rel="next"')
        headers["Link"] = ", ".join(rels)
    return _json(items[(page - 1) * per_page : page * per_page], 200, headers)


def _json(body: Any, status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers={**RATE_LIMIT, **(headers or {})})
