"""Requests a resync costs, per reference connector and table: when nothing changed upstream,
and when 1 % of the rows were deleted (and how many of those the resync tombstoned).

    python -m bench.resync_requests                 # prints a table
    python -m bench.resync_requests --pages 10,100  # GitHub listings of that many pages
    python -m bench.resync_requests [--json]

Each reference connector syncs a provider answering as its docs say (mocked with respx, so the
numbers are exact and the same on every machine): GitHub (two repositories of ``pages`` pages of
100 issues and 120 pull requests each; ``since``, ``ETag``/``If-None-Match`` and 304 honoured,
and an issue asked for by number answering 404 once deleted, as GitHub does), Procore (three
projects of 150 RFIs, ``Total`` headers, ``filters[updated_at]`` honoured, a deleted RFI a 404)
and Microsoft Graph (one drive of 250 text files, a delta link that answers the changes since,
deleted items with the ``deleted`` facet, and each file's ``/content`` a 302 to a download URL,
fetched by the ingestions the sync queues but not counted). The first sync reads everything; the
second, with nothing changed, is what every scheduled sync costs; the third follows the deletion
of 1 % of the issues, RFIs or files. Requests are counted per table, with 304s apart; a request
about one item (a deletion confirmed) counts under "TABLE (item)". The script uses only the
public API, so the same command measures any version of the engine.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import respx
from rich.table import Table

from bench.common import (
    add_json_option,
    console,
    json_mode,
    machine_info,
    print_json,
    scratch_database,
    settings_for,
)

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "connectors" / "fixtures"
GITHUB = "https://api.github.com"
PROCORE = "https://api.procore.com"
GRAPH = "https://graph.microsoft.com/v1.0"
DRIVE = "b!drive"
DOWNLOAD = "https://contoso.sharepoint.com/sites/Engineering/_layouts/15/download.aspx"


def fixture(provider: str, name: str) -> Any:
    return json.loads((FIXTURES / provider / name).read_text())


def respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    content = b"" if status == 304 else json.dumps(body).encode()
    return httpx.Response(
        status, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


class Counted:
    """Requests by table (a function of the request) and status; ``delete(share)`` deletes that
    share of the provider's main table and says how many rows."""

    def __init__(self, table_of: Callable[[httpx.Request], str]) -> None:
        self.table_of = table_of
        self.counts: Counter[tuple[str, int]] = Counter()
        self.delete: Callable[[float], int] = lambda share: 0

    def record(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        self.counts[(self.table_of(request), response.status_code)] += 1
        return response


# -- GitHub ---------------------------------------------------------------------------------


def github(router: respx.Router, pages: int) -> Counted:
    issue, pull = fixture("github", "issues_page2.json")[0], fixture("github", "pulls.json")[0]
    repos = {}
    for r, name in enumerate(("Hello-World", "Spoon-Knife")):
        issues = []
        for n in range(1, pages * 100 + 1):
            item = copy.deepcopy(issue)
            item.update(id=10_000_000 * (r + 1) + n, number=n)
            issues.append(item)
        pulls = []
        for n in range(pages * 100 + 1, pages * 100 + 121):  # numbers follow the issues
            item = copy.deepcopy(pull)
            item.update(id=20_000_000 * (r + 1) + n, number=n)
            pulls.append(item)
        repos[name] = (r, issues, pulls)

    def table_of(request: httpx.Request) -> str:
        table = "pull_requests" if "/pulls" in request.url.path else "issues"
        return f"{table} (item)" if request.url.path.rsplit("/", 1)[-1].isdigit() else table

    counted = Counted(table_of)

    def delete(share: float) -> int:
        gone = 0
        for _, issues, _ in repos.values():
            step = round(1 / share)
            gone += len(issues[::step])
            del issues[::step]
        return gone

    counted.delete = delete

    def answer(request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        name = (
            parts[2]
            if parts[0] == "repos"
            else next(n for n, (r, _, _) in repos.items() if str(1000 + r) == parts[1])
        )
        r, issues, pulls = repos[name]
        if parts[-1].isdigit():  # one issue or pull request, by number
            number = int(parts[-1])
            listed = issues + pulls if parts[-2] == "issues" else pulls
            found = next((i for i in listed if i["number"] == number), None)
            status = 200 if found else 404
            return counted.record(request, respond(found or {"message": "Not Found"}, status))
        kind = parts[-1]
        params = request.url.params
        page, per_page = int(params.get("page", "1")), int(params.get("per_page", "30"))
        items = issues + [{**p, "pull_request": {}} for p in pulls] if kind == "issues" else pulls
        if "since" in params:
            items = [i for i in items if i["updated_at"] >= params["since"]]
        body = items[(page - 1) * per_page : page * per_page]
        etag = '"' + hashlib.sha256(json.dumps(body).encode()).hexdigest()[:20] + '"'
        headers = {"etag": etag, "x-ratelimit-remaining": "4000", "x-ratelimit-reset": "4102444800"}
        last = max((len(items) + per_page - 1) // per_page, 1)
        if page < last:
            query = {k: v for k, v in params.items() if k != "page"}
            url = httpx.URL(
                f"{GITHUB}/repositories/{1000 + r}/{kind}", params={**query, "page": page + 1}
            )
            end = httpx.URL(
                f"{GITHUB}/repositories/{1000 + r}/{kind}", params={**query, "page": last}
            )
            headers["link"] = f'<{url}>; rel="next", <{end}>; rel="last"'
        status = 304 if request.headers.get("if-none-match") == etag else 200
        return counted.record(request, respond(body, status, headers))

    router.get(url__regex=rf"^{GITHUB}/(repos|repositories)/").mock(side_effect=answer)
    return counted


# -- Procore --------------------------------------------------------------------------------


def procore(router: respx.Router) -> Counted:
    rfi, project = (
        fixture("procore", "rfis_1100417.json")[0],
        fixture("procore", "projects_page1.json")[0],
    )
    projects = [{**project, "id": 1_100_000 + p} for p in range(3)]
    rfis = {p["id"]: [{**rfi, "id": p["id"] * 1000 + n} for n in range(150)] for p in projects}

    def table_of(request: httpx.Request) -> str:
        path = request.url.path
        table = "rfis" if "/rfis" in path else "projects" if "/projects" in path else "companies"
        return f"{table} (item)" if path.rsplit("/", 1)[-1].isdigit() else table

    counted = Counted(table_of)

    def delete(share: float) -> int:
        gone = 0
        for listed in rfis.values():
            step = round(1 / share)
            gone += len(listed[::step])
            del listed[::step]
        return gone

    counted.delete = delete

    def listing(items: list[dict[str, Any]], request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if "filters[updated_at]" in params:
            since, until = params["filters[updated_at]"].split("...")
            items = [i for i in items if since <= i["updated_at"] <= until]
        page, per_page = int(params.get("page", "1")), int(params.get("per_page", "100"))
        body = items[(page - 1) * per_page : page * per_page]
        headers = {"Total": str(len(items)), "Per-Page": str(per_page)}
        return counted.record(request, respond(body, 200, headers))

    router.get(f"{PROCORE}/rest/v1.0/companies").mock(
        side_effect=lambda r: listing(fixture("procore", "companies.json"), r)
    )

    def shown(request: httpx.Request) -> httpx.Response:
        project, rfi = (int(p) for p in request.url.path.split("/")[4::2])
        found = next((i for i in rfis[project] if i["id"] == rfi), None)
        status = 200 if found else 404
        return counted.record(request, respond(found or {"errors": "404 Not Found"}, status))

    router.get(url__regex=rf"^{PROCORE}/rest/v1.0/projects/\d+/rfis/\d+(\?|$)").mock(
        side_effect=shown
    )
    router.get(url__regex=rf"^{PROCORE}/rest/v1.0/projects/\d+/rfis(\?|$)").mock(
        side_effect=lambda r: listing(rfis[int(r.url.path.split("/")[4])], r)
    )
    router.get(f"{PROCORE}/rest/v1.0/projects").mock(side_effect=lambda r: listing(projects, r))
    return counted


# -- Microsoft Graph ------------------------------------------------------------------------


def graph(router: respx.Router, pages: int) -> Counted:
    item = fixture("msgraph", "delta_page2.json")["value"][0]
    # Plain-text files, which the ingestions the sync queues index without a complaint.
    text = {**item["file"], "mimeType": "text/plain"}
    items = [
        {**item, "id": f"01ITEM{n:05d}", "name": f"Valve schedule {n}.txt", "file": text}
        for n in range(250)
    ]
    start = f"{GRAPH}/drives/{DRIVE}/root/delta"
    counted = Counted(lambda _: "drive_items")
    deleted: list[dict[str, Any]] = []  # what the delta link has to say

    def delete(share: float) -> int:
        gone = items[:: round(1 / share)]
        deleted.extend({"id": i["id"], "deleted": {"state": "deleted"}} for i in gone)
        return len(gone)

    counted.delete = delete

    def answer(request: httpx.Request) -> httpx.Response:
        token = request.url.params.get("token")
        if token == "latest":  # the delta link: what changed since
            body = {"value": list(deleted), "@odata.deltaLink": f"{start}?token=latest"}
            deleted.clear()
            return counted.record(request, respond(body))
        page = int(request.url.params.get("page", "0"))
        body: dict[str, Any] = {"value": items[page * 100 : (page + 1) * 100]}
        if (page + 1) * 100 < len(items):
            body["@odata.nextLink"] = f"{start}?page={page + 1}"
        else:
            body["@odata.deltaLink"] = f"{start}?token=latest"
        return counted.record(request, respond(body))

    router.get(start).mock(side_effect=answer)

    # The files the sync queues for ingestion are fetched as Graph's docs say: /content answers
    # 302 Found with a pre-authenticated URL on the SharePoint host, which serves the bytes.
    # Neither is a request of the sync, so neither is counted.
    def content(request: httpx.Request) -> httpx.Response:
        item = request.url.path.split("/")[-2]
        location = f"{DOWNLOAD}?UniqueId={item}&tempauth=bench"
        return httpx.Response(302, headers={"Location": location, "Content-Length": "0"})

    router.get(url__regex=rf"^{GRAPH}/drives/[^/]+/items/[^/]+/content$").mock(side_effect=content)
    router.get(url__regex=rf"^{DOWNLOAD}").mock(
        return_value=httpx.Response(
            200, content=b"Valve V-101: open\n", headers={"Content-Type": "text/plain"}
        )
    )
    token = {"token_type": "Bearer", "expires_in": 3599, "access_token": "graph-token"}
    router.post(url__regex=r"^https://login\.microsoftonline\.com/").mock(
        return_value=respond(token)
    )
    return counted


Mock = Callable[[respx.Router, int], Counted]
CONNECTORS: dict[str, tuple[Mock, dict[str, Any], dict[str, Any]]] = {
    "github": (
        github,
        {"owner": "octocat", "repos": ["Hello-World", "Spoon-Knife"]},
        {"token": "ghp_bench"},
    ),
    "procore": (
        lambda router, _: procore(router),
        {"company_id": 8089},
        {
            "client_id": "bench-client",
            "client_secret": "bench-secret",
            "access_token": "at-0",
            "refresh_token": "rt-0",
            "expires_at": time.time() + 36_000,
        },
    ),
    "msgraph_drive": (
        graph,
        {"tenant_id": "contoso", "drive_id": DRIVE},
        {"client_id": "bench-client", "client_secret": "bench-secret"},
    ),
}


SYNCS = ("first sync", "resync, nothing changed", "resync after 1 % deleted")


def measure(github_pages: list[int]) -> dict[str, dict[str, dict[str, int]]]:
    from sync import Engine

    found: dict[str, dict[str, dict[str, int]]] = {}
    cases = [(f"github, {p} pages", "github", p) for p in github_pages] + [
        (provider, provider, 0) for provider in CONNECTORS if provider != "github"
    ]
    with scratch_database("resync") as url, Engine(settings_for(url)) as engine:
        engine.migrate()
        ws = engine.create_workspace("bench")
        for case, provider, pages in cases:
            mock, config, credentials = CONNECTORS[provider]
            with respx.mock(assert_all_called=False) as router:
                counted = mock(router, pages)
                conn = engine.create_connection(
                    ws.id, case.replace(", ", "-").replace(" ", ""), provider, config=config,
                    credentials=credentials,
                )  # fmt: skip
                worker = engine.worker(listen=False)
                for sync in SYNCS:
                    deleted = counted.delete(0.01) if "deleted" in sync else 0
                    counted.counts.clear()
                    run = engine.sync(conn.id)
                    while not engine.run(run.id).is_terminal:
                        worker.poll()
                    ended = engine.run(run.id)
                    if ended.status != "succeeded":
                        sys.exit(f"{case}: the {sync} ended {ended.status}: {ended.error}")
                    tables: dict[str, int] = {}
                    for (table, code), n in sorted(counted.counts.items()):
                        key = table if code != 304 else f"{table} (304)"
                        tables[key] = tables.get(key, 0) + n
                    if deleted:
                        tables["rows deleted upstream"] = deleted
                        tables["rows tombstoned"] = sum(
                            int(r.get("tombstoned", 0)) for r in (ended.results or {}).values()
                        )
                    found.setdefault(case, {})[sync] = tables
                worker.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pages",
        default="10,100",
        help="GitHub listings of this many pages of 100 issues per repository (default 10,100)",
    )
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    found = measure([int(p) for p in args.pages.split(",") if p.strip()])
    table = Table(title="requests per sync, by table (304s apart)")
    for column in ("connector", "table", *SYNCS):
        table.add_column(column, justify="left" if column in ("connector", "table") else "right")
    for case, syncs in found.items():
        names = sorted({t for counts in syncs.values() for t in counts})
        for name in names:
            table.add_row(case, name, *(str(syncs[s].get(name, 0)) for s in SYNCS))
    console.print(table)
    print_json("resync_requests", args, found, machine=machine_info(None))


if __name__ == "__main__":
    main()
