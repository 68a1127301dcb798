"""Procore: companies, projects and RFIs through the real engine and Postgres, against respx mocks
shaped like Procore's docs (page/per_page with Link, Total and Per-Page headers; X-Rate-Limit-*
headers and 429s; OAuth2 refresh tokens that rotate)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import respx

from connectors import PermanentError
from connectors.http_policy import Verdict
from connectors.procore import (
    ProcoreConfig,
    ProcoreConnector,
    classify_procore,
    has_next_page,
)
from connectors.testing import FakeContext, read_table
from sync import Engine
from sync.base.settings import Settings
from sync.testing import run_sync
from tests.connectors.helpers import (
    fixture,
    json_response,
    live_ids,
    now,
    plain,
    requeued_in,
    result,
    stored_credentials,
    tombstoned_ids,
)

API = "https://api.procore.com"
COMPANIES = f"{API}/rest/v1.0/companies"
PROJECTS = f"{API}/rest/v1.0/projects"
TOKEN_URL = "https://login.procore.com/oauth/token"
COMPANY_ID = 8089
HARBOR, MEDICAL, PARKING = 1100417, 1100562, 1100733
CLIENT = {
    "client_id": "5c8f3b1a9e2d4c6b8a0f1e3d5c7b9a2e4f6d8c0b1a3e5f7d9c2b4a6e8f0d1c3b",
    "client_secret": "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
}


def rfis_url(project_id: int) -> str:
    return f"{API}/rest/v1.0/projects/{project_id}/rfis"


def procore(
    body: Any,
    status: int = 200,
    *,
    url: str | None = None,
    page: int = 1,
    per_page: int = 2,
    total: int | None = None,
    remaining: int = 3521,
    reset: int | None = None,
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    """A Procore response: rate-limit headers on every call; on a list, ``Total``,
    ``Per-Page`` and a ``Link`` header whose URLs carry only page and per_page (as Procore's
    do); the ``Link`` header is left out when the list fits on one page."""
    headers = {
        "Cache-Control": "no-store, must-revalidate, private, max-age=0",
        "X-Rate-Limit-Limit": "3600",
        "X-Rate-Limit-Remaining": str(remaining),
        "X-Rate-Limit-Reset": str(reset or int(time.time()) + 2400),
        "X-Request-Id": "aa5324bf-1b9a-4a8b-8ac7-7229d5d8d325",
        **(extra or {}),
    }
    if total is not None:
        headers.update({"Total": str(total), "Per-Page": str(per_page)})
        last = max(math.ceil(total / per_page), 1)
        if url is not None and last > 1:
            link = lambda n, rel: f'<{url}?page={n}&per_page={per_page}>; rel="{rel}"'  # noqa: E731
            rels = []
            if page > 1:
                rels += [link(1, "first"), link(page - 1, "prev")]
            if page < last:
                rels += [link(last, "last"), link(page + 1, "next")]
            headers["Link"] = ", ".join(rels)
    return json_response(body, status, headers)


class ProcoreAuthServer:
    """Procore's token endpoint and API gate: each refresh spends its refresh token and returns
    a new pair; a spent refresh token is refused with ``invalid_grant``."""

    def __init__(self, access_token: str = "at-0", refresh_token: str = "rt-0") -> None:
        self.live_access = {access_token}
        self.valid_refresh = {refresh_token}
        self.spent: list[str] = []

    def token(self, request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        assert form["grant_type"] == ["refresh_token"]
        assert form["client_id"] == [CLIENT["client_id"]]
        spent = form["refresh_token"][0]
        self.spent.append(spent)
        if spent not in self.valid_refresh:
            return json_response(fixture("procore", "invalid_grant.json"), 400)
        self.valid_refresh.discard(spent)
        n = len(self.spent)
        body = {**fixture("procore", "token.json"), "access_token": f"at-{n}"}
        body["refresh_token"] = f"rt-{n}"
        self.live_access.add(body["access_token"])
        self.valid_refresh.add(body["refresh_token"])
        return json_response(body)

    def gate(self, respond: Callable[[httpx.Request], httpx.Response]) -> Any:
        def handler(request: httpx.Request) -> httpx.Response:
            token = request.headers.get("authorization", "").removeprefix("Bearer ")
            if token not in self.live_access:
                return json_response(
                    fixture("procore", "unauthorized.json"),
                    401,
                    {"WWW-Authenticate": 'Bearer realm="Doorkeeper", error="invalid_token"'},
                )
            return respond(request)

        return handler


def connect(engine: Engine, **credentials: Any) -> int:
    ws = engine.create_workspace("vertex")
    values = {
        **CLIENT,
        "access_token": "at-0",
        "refresh_token": "rt-0",
        "expires_at": time.time() + 3600,
        **credentials,
    }
    conn = engine.create_connection(
        ws.id,
        "procore",
        "procore",
        config={"company_id": COMPANY_ID, "per_page": 2},
        credentials=values,
    )
    return conn.id


def mock_company(respx_mock: respx.MockRouter) -> dict[str, respx.Route]:
    """A company with two companies visible, three projects over two pages, and their RFIs."""
    routes = {
        "companies": respx_mock.get(COMPANIES).mock(
            return_value=procore(fixture("procore", "companies.json"), total=2)
        ),
        "projects_2": respx_mock.get(PROJECTS, params={"page": "2"}).mock(
            return_value=procore(
                fixture("procore", "projects_page2.json"), url=PROJECTS, page=2, total=3
            )
        ),
        "projects_1": respx_mock.get(PROJECTS, params={"page": "1"}).mock(
            return_value=procore(
                fixture("procore", "projects_page1.json"), url=PROJECTS, page=1, total=3
            )
        ),
    }
    for project_id in (HARBOR, MEDICAL, PARKING):
        body = fixture("procore", f"rfis_{project_id}.json")
        routes[f"rfis_{project_id}"] = respx_mock.get(rfis_url(project_id)).mock(
            return_value=procore(body, total=len(body))
        )
    return routes


def test_first_sync_then_updates_deletions_and_additions(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    routes = mock_company(respx_mock)
    conn_id = connect(sync_engine)

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {
        "companies": result(upserted=2),
        "projects": result(upserted=3),
        "rfis": result(upserted=3),
    }
    assert live_ids(sync_engine, conn_id, "projects") == {str(HARBOR), str(MEDICAL), str(PARKING)}
    rfis = {r.external_id: r.data for r in sync_engine.records(conn_id, "rfis")}
    assert set(rfis) == {"274801", "274833", "281007"}
    assert rfis["281007"]["project_id"] == MEDICAL
    for call in respx_mock.calls:
        assert call.request.headers["procore-company-id"] == str(COMPANY_ID)
        assert call.request.headers["authorization"] == "Bearer at-0"
    assert parse_qs(routes["projects_1"].calls.last.request.url.query.decode()) == {
        "company_id": ["8089"],
        "page": ["1"],
        "per_page": ["2"],
    }

    # Upstream: the parking structure project was deleted, RFI 12 answered and closed, the MRI
    # RFI recycled and a new one asked on the medical building.
    routes["projects_1"].mock(
        return_value=procore(fixture("procore", "projects_page1.json"), url=PROJECTS, total=2)
    )
    harbor = fixture("procore", "rfis_1100417.json")
    harbor[0].update(status="closed", updated_at="2024-05-06T17:30:00Z", time_resolved="2024-05-06")
    routes[f"rfis_{HARBOR}"].mock(return_value=procore(harbor, total=2))
    fresh = fixture("procore", "rfis_1100562.json")[0]
    fresh.update(id=281090, number="2", subject="Door hardware at the MRI suite", status="open")
    routes[f"rfis_{MEDICAL}"].mock(return_value=procore([fresh], total=1))

    # The next sync lists everything again. The project is confirmed gone before it is
    # tombstoned, and so is the recycled RFI; the project's RFIs go with it, as a partition the
    # listing of projects no longer holds.
    parking = respx_mock.get(f"{PROJECTS}/{PARKING}").mock(
        return_value=procore({"errors": "404 Not Found"}, 404)
    )
    recycled = respx_mock.get(f"{rfis_url(MEDICAL)}/281007").mock(
        return_value=procore({"errors": "404 Not Found"}, 404)
    )
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {
        "companies": result(unchanged=2),
        "projects": result(unchanged=2, tombstoned=1),
        "rfis": result(upserted=2, unchanged=1, tombstoned=1),
    }
    assert (parking.call_count, recycled.call_count) == (1, 1)
    assert "filters[updated_at]" not in routes[f"rfis_{HARBOR}"].calls.last.request.url.params
    assert tombstoned_ids(sync_engine, conn_id, "projects") == {str(PARKING)}
    assert tombstoned_ids(sync_engine, conn_id, "rfis") == {"281007"}
    assert live_ids(sync_engine, conn_id, "rfis") == {"274801", "274833", "281090"}
    assert set(run.results["rfis"]["partitions"]) == {str(HARBOR), str(MEDICAL), str(PARKING)}


@pytest.mark.parametrize(
    ("complete_every", "rfi_pages"),
    [(None, 3), ("procore.rfis=1d", 1)],
    ids=["listed-whole", "operator-opt-in"],
)
def test_a_resync_with_nothing_changed_lists_every_rfi_unless_an_operator_opts_out(
    sync_engine: Engine, respx_mock: respx.MockRouter, complete_every: str | None, rfi_pages: int
) -> None:
    routes = mock_company(respx_mock)
    # The harbor project has five RFIs (three pages of two), listed as Procore lists them: by
    # update time when asked with filters[updated_at].
    base = fixture("procore", "rfis_1100417.json")[0]
    harbor = [{**base, "id": 274_900 + n, "number": str(n)} for n in range(5)]

    def harbor_rfis(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        rfis = harbor
        if "filters[updated_at]" in params:
            since, until = params["filters[updated_at]"].split("...")
            rfis = [r for r in harbor if since <= r["updated_at"] <= until]
        page, per_page = int(params["page"]), int(params["per_page"])
        return procore(
            rfis[(page - 1) * per_page : page * per_page],
            url=rfis_url(HARBOR),
            page=page,
            per_page=per_page,
            total=len(rfis),
        )

    routes[f"rfis_{HARBOR}"].mock(side_effect=harbor_rfis)
    if complete_every is not None:
        sync_engine.settings.complete_every = Settings(complete_every=complete_every).complete_every
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    assert routes[f"rfis_{HARBOR}"].call_count == 3

    before = {name: route.call_count for name, route in routes.items()}
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    asked = {name: route.call_count - before[name] for name, route in routes.items()}
    # Companies and projects are listed whole (one page of companies, two of projects). Each
    # project's RFIs are listed whole too, a request per page, so a deletion is found now;
    # with the operator's opt-in, once per project by update time, whatever their number.
    assert asked == {
        "companies": 1,
        "projects_1": 1,
        "projects_2": 1,
        f"rfis_{HARBOR}": rfi_pages,
        **{f"rfis_{p}": 1 for p in (MEDICAL, PARKING)},
    }
    assert run.results["rfis"]["upserted"] == 0
    assert run.results["rfis"]["tombstoned"] == 0


def test_a_company_is_tombstoned_only_once_two_complete_listings_missed_it(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    # Companies have no show endpoint to confirm a deletion with, and their listing is paged by
    # page number, so it can shift: one listing that misses a company proves nothing.
    routes = mock_company(respx_mock)
    both = fixture("procore", "companies.json")
    mine, harbor_steel = both
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    def sync_listing(*companies: dict[str, Any]) -> dict[str, Any]:
        routes["companies"].mock(return_value=procore(list(companies), total=len(companies)))
        run = run_sync(sync_engine, conn_id)
        assert run.status == "succeeded", run.error
        return plain(run.results)["companies"]

    missing = str(harbor_steel["id"])
    assert sync_listing(mine)["tombstoned"] == 0  # missed once: kept
    assert missing in live_ids(sync_engine, conn_id, "companies")
    sync_listing(mine, harbor_steel)  # listed again: the miss is forgotten
    assert sync_listing(mine)["tombstoned"] == 0  # so this is a first miss again
    assert missing in live_ids(sync_engine, conn_id, "companies")

    assert sync_listing(mine) == result(unchanged=1, tombstoned=1)  # missed twice in a row
    assert tombstoned_ids(sync_engine, conn_id, "companies") == {missing}
    assert live_ids(sync_engine, conn_id, "companies") == {str(mine["id"])}


def test_rotated_refresh_tokens_are_saved_and_spent_next_time(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    server = ProcoreAuthServer()
    tokens = respx_mock.post(TOKEN_URL).mock(side_effect=server.token)
    companies = respx_mock.get(COMPANIES).mock(
        side_effect=server.gate(lambda _: procore(fixture("procore", "companies.json"), total=2))
    )
    respx_mock.get(PROJECTS).mock(side_effect=server.gate(lambda _: procore([], total=0)))
    # The stored access token has expired: the first request refreshes it.
    conn_id = connect(sync_engine, expires_at=time.time() - 30)

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert server.spent == ["rt-0"]
    saved = stored_credentials(sync_engine, conn_id)
    assert (saved["access_token"], saved["refresh_token"]) == ("at-1", "rt-1")
    assert saved["expires_at"] > time.time() + 5000  # from expires_in: 5400
    assert companies.calls.last.request.headers["authorization"] == "Bearer at-1"

    # Procore revokes at-1 early: the next sync meets a 401, refreshes with the rotated token
    # (rt-0 would be refused now) and carries on with the new access token.
    server.live_access.discard("at-1")
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert server.spent == ["rt-0", "rt-1"]
    first, retried = companies.calls[-2:]
    assert first.request.headers["authorization"] == "Bearer at-1"
    assert retried.request.headers["authorization"] == "Bearer at-2"
    saved = stored_credentials(sync_engine, conn_id)
    assert (saved["access_token"], saved["refresh_token"]) == ("at-2", "rt-2")

    # Credentials restored from an old backup hold a spent refresh token: Procore refuses it
    # and the connection is disconnected until someone authorizes again.
    server.live_access.discard("at-2")
    sync_engine.update_credentials(conn_id, {**saved, "refresh_token": "rt-1"})
    run = run_sync(sync_engine, conn_id)
    assert run.status == "failed"
    assert run.error is not None and run.error.kind == "auth"
    assert "invalid_grant" in run.error.message
    assert sync_engine.connection(conn_id).status == "disconnected"
    assert tokens.call_count == 3


def test_a_429_waits_until_the_reset_it_names(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    reset = int(time.time()) + 1200
    respx_mock.get(COMPANIES).mock(
        return_value=procore(fixture("procore", "rate_limited.json"), 429, remaining=0, reset=reset)
    )
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert (run.attempts, run.waits) == (0, 1)  # a wait spends no attempt
    assert abs(run.queued_at.timestamp() - reset) <= 2
    assert run.results["companies"]["error"]["kind"] == "rate_limited"


@pytest.mark.parametrize(
    ("status", "body"),
    [(429, {"errors": "Too Many Requests"}), (503, {"errors": "Service Unavailable"})],
    ids=["429", "503-heavy-load"],
)
def test_a_long_retry_after_requeues_the_run_at_that_time(
    sync_engine: Engine, respx_mock: respx.MockRouter, status: int, body: dict[str, str]
) -> None:
    # 503 with Retry-After is Procore's heavy-load throttling; a Retry-After on a 429 wins over
    # the X-Rate-Limit-Reset it carries.
    respx_mock.get(COMPANIES).mock(
        return_value=procore(body, status, extra={"Retry-After": "600"}, remaining=0)
    )
    conn_id = connect(sync_engine)
    before = now()
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert abs(requeued_in(run, after=before) - 600) <= 2


def test_a_reset_a_moment_away_is_waited_for_inside_the_run(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    companies = respx_mock.get(COMPANIES).mock(
        side_effect=[
            procore(
                fixture("procore", "rate_limited.json"),
                429,
                remaining=0,
                reset=int(time.time()) + 2,
            ),
            procore(fixture("procore", "companies.json"), total=2),
        ]
    )
    respx_mock.get(PROJECTS).mock(return_value=procore([], total=0))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded" and run.attempts == 1
    assert companies.call_count == 2
    assert plain(run.results)["companies"] == result(upserted=2)


def test_the_last_request_of_the_budget_holds_the_next_one_until_the_reset(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    reset = int(time.time()) + 900
    respx_mock.get(COMPANIES).mock(
        return_value=procore(
            fixture("procore", "companies.json"), total=2, remaining=0, reset=reset
        )
    )
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert plain(run.results)["companies"] == result(upserted=2)
    assert run.results["projects"]["error"]["kind"] == "rate_limited"
    assert abs(run.queued_at.timestamp() - reset) <= 2


def test_a_record_without_a_primary_key_fails_its_table_and_loses_nothing(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    routes = mock_company(respx_mock)
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    harbor = fixture("procore", "rfis_1100417.json")
    harbor[0]["status"] = "closed"
    routes[f"rfis_{HARBOR}"].mock(return_value=procore(harbor, total=2))
    broken = fixture("procore", "rfis_1100562.json")
    broken[0]["id"] = None
    routes[f"rfis_{MEDICAL}"].mock(return_value=procore(broken, total=1))

    run = run_sync(sync_engine, conn_id)
    assert run.status == "partial"
    rfis = run.results["rfis"]
    # The project with the bad record fails; the others are read.
    assert rfis["status"] == "partial"
    assert rfis["partitions"][str(MEDICAL)]["error"]["message"] == (
        f"{MEDICAL}: a record of table 'rfis' has no primary key field 'id'"
    )
    assert str(MEDICAL) in rfis["error"]["message"]
    assert rfis["partitions"][str(HARBOR)]["status"] == "succeeded"
    # What came before the bad record is written; nothing is tombstoned.
    assert (rfis["upserted"], rfis["unchanged"], rfis["tombstoned"]) == (1, 1, 0)
    records = {r.external_id: r.data for r in sync_engine.records(conn_id, "rfis")}
    assert set(records) == {"274801", "274833", "281007"}
    assert records["274801"]["status"] == "closed"
    assert plain(run.results)["projects"] == result(unchanged=3)


# -- offline, with FakeContext -------------------------------------------------------------


def offline() -> ProcoreConnector:
    context = FakeContext(
        config=ProcoreConfig(company_id=COMPANY_ID, per_page=2),
        credentials={**CLIENT, "access_token": "at-0", "refresh_token": "rt-0"},
    )
    return ProcoreConnector(context)


def test_a_server_that_ignores_the_page_number_is_a_paging_loop(
    respx_mock: respx.MockRouter,
) -> None:
    same = respx_mock.get(COMPANIES).mock(
        return_value=procore(fixture("procore", "companies.json"), url=COMPANIES, total=9)
    )
    with pytest.raises(PermanentError, match="paging loop"):
        read_table(offline(), "companies")
    assert same.call_count == 2


@pytest.mark.parametrize(
    ("headers", "items", "fetched", "expected"),
    [
        (
            {"Link": '<u?page=2&per_page=2>; rel="next", <u?page=5&per_page=2>; rel="last"'},
            2,
            2,
            True,
        ),
        (
            {"Link": '<u?page=1&per_page=2>; rel="first", <u?page=4&per_page=2>; rel="prev"'},
            2,
            10,
            False,
        ),
        ({"Total": "5", "Per-Page": "2"}, 2, 4, True),
        ({"Total": "4", "Per-Page": "2"}, 2, 4, False),
        ({"Total": "9", "Per-Page": "2"}, 1, 3, False),  # a short page ends the list
        ({}, 2, 2, True),  # no headers at all: a full page may have a successor
        ({}, 0, 0, False),
    ],
    ids=["link-next", "link-last", "total-more", "total-reached", "short", "bare-full", "empty"],
)
def test_when_another_page_follows(
    headers: dict[str, str], items: int, fetched: int, expected: bool
) -> None:
    response = httpx.Response(200, headers=headers, request=httpx.Request("GET", COMPANIES))
    assert has_next_page(response, items, fetched, per_page=2) is expected


def test_a_procore_429_waits_for_retry_after_else_the_reset() -> None:
    at = now()
    reset = str(int(at.timestamp()) + 300)
    with_reset = classify_procore(httpx.Response(429, headers={"X-Rate-Limit-Reset": reset}), at)
    assert with_reset is not None and with_reset.verdict is Verdict.RATE_LIMITED
    assert with_reset.wait is not None and abs(with_reset.wait - 300) <= 1
    both = httpx.Response(429, headers={"Retry-After": "20", "X-Rate-Limit-Reset": reset})
    assert (found := classify_procore(both, at)) is not None and found.wait == 20
    assert classify_procore(httpx.Response(403), at) is None


def test_the_budget_key_is_the_oauth_app_never_a_secret() -> None:
    config = ProcoreConfig(company_id=COMPANY_ID)
    key = ProcoreConnector.budget_key(config, {**CLIENT, "access_token": "at-0"})
    assert key is not None and CLIENT["client_id"] in key
    assert CLIENT["client_secret"] not in key and "at-0" not in key
    other_company = ProcoreConfig(company_id=31252)
    assert ProcoreConnector.budget_key(other_company, CLIENT) == key


def test_a_project_made_inactive_takes_its_rfis_out_at_the_next_sync(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    routes = mock_company(respx_mock)
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    harbor_rfis = {"274801", "274833"}
    assert harbor_rfis <= live_ids(sync_engine, conn_id, "rfis")

    # The harbor project is made inactive: Procore's listing of projects holds active ones
    # only, and its show endpoint says `active: false`.
    page_1 = fixture("procore", "projects_page1.json")
    shown = {**page_1[0], "active": False}
    assert shown["id"] == HARBOR
    routes["projects_1"].mock(
        return_value=procore(page_1[1:] + fixture("procore", "projects_page2.json"), total=2)
    )
    routes["projects_2"].mock(return_value=procore([], page=2, total=2))
    show = respx_mock.get(f"{PROJECTS}/{HARBOR}").mock(return_value=procore(shown))
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert show.call_count == 1
    assert tombstoned_ids(sync_engine, conn_id, "projects") == {str(HARBOR)}
    # Its RFIs are out of the connection's scope: tombstoned without a request about each.
    assert tombstoned_ids(sync_engine, conn_id, "rfis") == harbor_rfis
    assert run.results["rfis"]["partitions"][str(HARBOR)]["tombstoned"] == 2
    assert routes[f"rfis_{HARBOR}"].call_count == 1  # the first sync's, no other


def test_an_rfi_moved_to_the_recycle_bin_is_tombstoned_at_the_next_sync(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    routes = mock_company(respx_mock)
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    # One RFI is recycled, the other purged: both leave the listing. The show endpoint still
    # shows the recycled one, marked deleted; the purged one is a 404.
    recycled, purged = fixture("procore", "rfis_1100417.json")
    routes[f"rfis_{HARBOR}"].mock(return_value=procore([], total=0))
    shown = respx_mock.get(f"{rfis_url(HARBOR)}/{recycled['id']}").mock(
        return_value=procore({**recycled, "deleted_at": "2024-05-07T09:00:00Z"})
    )
    missing = respx_mock.get(f"{rfis_url(HARBOR)}/{purged['id']}").mock(
        return_value=procore({"errors": "404 Not Found"}, 404)
    )
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert (shown.call_count, missing.call_count) == (1, 1)
    assert tombstoned_ids(sync_engine, conn_id, "rfis") == {str(recycled["id"]), str(purged["id"])}
