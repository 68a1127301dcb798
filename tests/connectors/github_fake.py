"""A stateful stand-in for GitHub's REST API behind respx, answering as GitHub's docs say: list
endpoints paged by page number with a ``Link`` header whose URLs name the repository by id
(``next``, ``last``, ``prev``, ``first``), ``since``/``sort``/``direction`` on issues, an
``ETag`` on every list page and 304 for a matching ``If-None-Match`` (which does not spend the
rate limit), ``x-ratelimit-*`` headers on every answer, one issue or pull request by number
(404 once deleted, 301 to its new home once transferred), 404 for a repository the token
cannot see and 403 for one it may no longer read. Tests change its data between requests, or
while a page is served (``on_page``)."""

from __future__ import annotations

import copy
import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import respx

from tests.connectors.helpers import fixture

BASE = "https://api.github.com"
OWNER = "octocat"
FORBIDDEN = {
    "message": "Resource not accessible by personal access token",
    "documentation_url": "https://docs.github.com/rest/issues/issues#list-repository-issues",
    "status": "403",
}
NOT_FOUND = {
    "message": "Not Found",
    "documentation_url": "https://docs.github.com/rest/issues/issues#list-repository-issues",
    "status": "404",
}


def _offset(repo: str) -> int:
    """Ids are global on GitHub: each repository's items get their own range."""
    return 0 if repo == "Hello-World" else (zlib.crc32(repo.encode()) % 97 + 1) * 100_000


def make_issue(
    repo: str, number: int, *, updated_at: str = "2024-05-01T12:02:10Z"
) -> dict[str, Any]:
    """An issue shaped like GitHub's, from a recorded one."""
    issue = copy.deepcopy(fixture("github", "issues_page2.json")[0])
    url = f"{BASE}/repos/{OWNER}/{repo}/issues/{number}"
    issue.update(
        id=10_000_000 + _offset(repo) + number,
        node_id=f"I_kwDOABII58{number}",
        number=number,
        title=f"Issue {number}",
        url=url,
        repository_url=f"{BASE}/repos/{OWNER}/{repo}",
        html_url=f"https://github.com/{OWNER}/{repo}/issues/{number}",
        comments_url=f"{url}/comments",
        events_url=f"{url}/events",
        labels_url=f"{url}/labels{{/name}}",
        timeline_url=f"{url}/timeline",
        created_at=f"2024-01-01T00:{number // 60 % 60:02d}:{number % 60:02d}Z",
        updated_at=updated_at,
    )
    issue["reactions"]["url"] = f"{url}/reactions"
    return issue


def make_pull(repo: str, number: int, *, open_issues: int = 3) -> dict[str, Any]:
    """A pull request shaped like GitHub's, embedding its repository (head and base)."""
    pull = copy.deepcopy(fixture("github", "pulls.json")[0])
    pull.update(
        id=20_000_000 + _offset(repo) + number, number=number, title=f"Pull request {number}"
    )
    for side in ("head", "base"):
        pull[side]["repo"]["open_issues_count"] = open_issues
    return pull


@dataclass
class Repo:
    id: int
    issues: list[dict[str, Any]] = field(default_factory=list)
    pulls: list[dict[str, Any]] = field(default_factory=list)
    transferred: dict[int, str] = field(default_factory=dict)  # issue number -> new URL
    visible: bool = True
    forbidden: bool = False  # the token lost its permission: 403, as GitHub answers then
    failing: bool = False  # answers 500, as GitHub does when something breaks on its side


class GitHub:
    """The fake. ``requests`` counts what it answered, by kind."""

    def __init__(self, respx_mock: respx.MockRouter | None = None, base: str = BASE) -> None:
        """Behind ``respx_mock``, at GitHub's address; else served by the caller (a
        ``ProviderServer``) at ``base``."""
        self.base = base
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, int]] = []  # (path and query, status)
        self.remaining = 5000
        self.on_page: Callable[[str, str, int], None] | None = None  # (repo, kind, page)
        if respx_mock is not None:
            respx_mock.get(url__regex=rf"^{BASE}/(repos|repositories)/.*").mock(
                side_effect=self.answer
            )

    def repo(self, name: str) -> Repo:
        if name not in self.repos:
            self.repos[name] = Repo(id=1_296_269 + len(self.repos))
        return self.repos[name]

    def count(self, status: int | None = None) -> int:
        return sum(1 for _, s in self.requests if status is None or s == status)

    # -- answering -------------------------------------------------------------------------

    def answer(self, request: httpx.Request) -> httpx.Response:
        response = self._answer(request)
        where = request.url.raw_path.decode()
        self.requests.append((where, response.status_code))
        return response

    def _answer(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        if parts[0] == "repositories":  # a Link URL: the repository by id
            name = next((n for n, r in self.repos.items() if str(r.id) == parts[1]), "")
            rest = parts[2:]
        else:
            name, rest = parts[2], parts[3:]
        repo = self.repos.get(name)
        if repo is None or not repo.visible:
            return self._json(NOT_FOUND, 404)
        if repo.forbidden:
            return self._json(FORBIDDEN, 403)
        if repo.failing:
            return self._json({"message": "Server Error"}, 500)
        kind = rest[0]
        if len(rest) == 2:
            return self._item(repo, name, kind, int(rest[1]))
        return self._list(request, repo, name, kind)

    def _item(self, repo: Repo, name: str, kind: str, number: int) -> httpx.Response:
        if kind == "issues" and number in repo.transferred:
            return self._json(
                {"message": "Moved Permanently", "url": repo.transferred[number],
                 "documentation_url": "https://docs.github.com/rest/guides/best-practices-for-using-the-rest-api#follow-redirects"},
                301,
                {"location": repo.transferred[number]},
            )  # fmt: skip
        items = repo.issues + repo.pulls if kind == "issues" else repo.pulls
        found = next((i for i in items if i["number"] == number), None)
        return self._json(found, 200) if found is not None else self._json(NOT_FOUND, 404)

    def _list(self, request: httpx.Request, repo: Repo, name: str, kind: str) -> httpx.Response:
        params = request.url.params
        page, per_page = int(params.get("page", "1")), int(params.get("per_page", "30"))
        if self.on_page is not None:
            self.on_page(name, kind, page)
        if kind == "issues":
            # The issues endpoint lists pull requests too, marked with `pull_request`.
            items = repo.issues + [
                {**p, "id": p["id"] + 1, "pull_request": {"url": p["url"]}} for p in repo.pulls
            ]
            if "since" in params:
                items = [i for i in items if i["updated_at"] >= params["since"]]
            key = "updated_at" if params.get("sort") == "updated" else "created_at"
            items.sort(
                key=lambda i: (i[key], i["number"]), reverse=params.get("direction") == "desc"
            )
        else:
            items = sorted(repo.pulls, key=lambda i: i["number"])
        last = max((len(items) + per_page - 1) // per_page, 1)
        body = items[(page - 1) * per_page : page * per_page]
        etag = (
            '"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32] + '"'
        )
        headers = {"etag": etag}
        links = []
        query = {k: v for k, v in params.items() if k != "page"}

        def link(n: int, rel: str) -> str:
            url = httpx.URL(
                f"{self.base}/repositories/{repo.id}/{kind}", params={**query, "page": n}
            )
            return f'<{url}>; rel="{rel}"'

        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(page - 1, "prev"), link(1, "first")]
        if links:
            headers["link"] = ", ".join(links)
        if request.headers.get("if-none-match") == etag:
            return self._json(None, 304, headers, spend=False)
        return self._json(body, 200, headers)

    def _json(
        self, body: Any, status: int, headers: dict[str, str] | None = None, *, spend: bool = True
    ) -> httpx.Response:
        if spend:
            self.remaining -= 1
        all_headers = {
            "content-type": "application/json; charset=utf-8",
            "x-github-api-version-selected": "2022-11-28",
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": str(self.remaining),
            "x-ratelimit-reset": "4102444800",
            "x-ratelimit-used": str(5000 - self.remaining),
            "x-ratelimit-resource": "core",
            **(headers or {}),
        }
        content = b"" if status == 304 else json.dumps(body).encode()
        return httpx.Response(status, content=content, headers=all_headers)
