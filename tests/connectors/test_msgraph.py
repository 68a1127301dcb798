"""Microsoft Graph drive items: the delta query through the real engine and Postgres, against
respx mocks shaped like Graph's driveItem delta docs (nextLink/deltaLink, the `deleted` facet, 410
resync, Retry-After) and the Microsoft identity platform's client-credentials token response."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import respx

from connectors import Checkpoint, Deleted, PermanentError, Resync
from connectors.msgraph import GraphDriveConfig, GraphDriveConnector
from connectors.testing import FakeContext, read_table
from sync import Engine
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

TENANT = "3f2c6d1e-8b4a-4f0e-9c7d-2a1b5e6f7a80"
DRIVE = "b!-RIj2DuyvEyV1T4NlOaMHk8XkS_I8MdFlUCq1BlcjgmhRfAj3-Z8RY2VpuvV_tpd"
GRAPH = "https://graph.microsoft.com/v1.0"
DELTA = f"{GRAPH}/drives/{DRIVE}/root/delta"
TOKEN_URL = f"https://login.microsoftonline.com/{TENANT}/oauth2/v2.0/token"
CLIENT = {
    "client_id": "6731de76-14a6-49ae-97bc-6eba6914391e",
    "client_secret": "qWgdYAmab0YSkuL1qKv5bPX",
}

PAGE_1 = fixture("msgraph", "delta_page1.json")
NEXT_LINK = PAGE_1["@odata.nextLink"]
DELTA_LINK = fixture("msgraph", "delta_page2.json")["@odata.deltaLink"]
CHANGES_LINK = fixture("msgraph", "delta_changes.json")["@odata.deltaLink"]
FIRST_IDS = {item["id"] for item in PAGE_1["value"]} | {
    item["id"] for item in fixture("msgraph", "delta_page2.json")["value"]
}
VALVE_SCHEDULE = "01BYE5RZ4HPYPF4QSZ6BCJJ42DPZ4TWL3J"
SITE_PLAN = "01BYE5RZ7JDQ2XYZP6KRG3ZU5LJEWRP4QA"
MARKUP = "01BYE5RZZ5M5QGQ3PGNVGKZ6KR3QNNOWLE"


def token(access_token: str) -> httpx.Response:
    return json_response({**fixture("msgraph", "token.json"), "access_token": access_token})


def graph(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    """A Graph response with the diagnostic headers Graph sends."""
    return json_response(
        body,
        status,
        {
            "request-id": "3c5e4d5f-2f3a-4c1b-9a0e-9d0f6a4c2b11",
            "client-request-id": "3c5e4d5f-2f3a-4c1b-9a0e-9d0f6a4c2b11",
            "x-ms-ags-diagnostic": '{"ServerInfo":{"DataCenter":"West Europe","Slice":"E"}}',
            "odata-version": "4.0",
            **(headers or {}),
        },
    )


def delta_route(respx_mock: respx.MockRouter, link: str) -> respx.Route:
    """A route for one delta or next link (a delta link differs from the start only by its
    token, so it is matched with its query)."""
    url = httpx.URL(link)
    return respx_mock.get(url.copy_with(query=None), params=url.params)


def connect(engine: Engine) -> int:
    ws = engine.create_workspace("contoso")
    conn = engine.create_connection(
        ws.id,
        "engineering-docs",
        "msgraph_drive",
        config={"tenant_id": TENANT, "drive_id": DRIVE},
        credentials=CLIENT,
    )
    return conn.id


def saved_cursor(engine: Engine, connection_id: int) -> Any:
    with engine.pool.connection() as conn:
        row = conn.execute(
            "SELECT cursor FROM table_state WHERE connection_id = %s AND table_name = %s",
            (connection_id, "drive_items"),
        ).fetchone()
    # The drive is the table's one partition: its delta link is kept under its id.
    return row["cursor"].get(DRIVE) if row and row["cursor"] else None


def test_first_enumeration_then_changes_from_the_delta_link(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    tokens = respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    changes = delta_route(respx_mock, DELTA_LINK).mock(
        return_value=graph(fixture("msgraph", "delta_changes.json"))
    )
    page_2 = delta_route(respx_mock, NEXT_LINK).mock(
        return_value=graph(fixture("msgraph", "delta_page2.json"))
    )
    page_1 = respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page1.json")))
    conn_id = connect(sync_engine)

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {"drive_items": result(upserted=5)}
    assert live_ids(sync_engine, conn_id, "drive_items") == FIRST_IDS
    assert saved_cursor(sync_engine, conn_id) == {"delta_link": DELTA_LINK}
    form = parse_qs(tokens.calls.last.request.content.decode())
    assert form["grant_type"] == ["client_credentials"]
    assert form["scope"] == ["https://graph.microsoft.com/.default"]
    assert form["client_id"] == [CLIENT["client_id"]]
    assert page_1.calls.last.request.headers["authorization"] == "Bearer graph-token-1"
    assert page_2.call_count == 1

    # Upstream: the spec was edited, the valve schedule deleted, a markup uploaded.
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {"drive_items": result(upserted=3, tombstoned=1)}
    assert changes.call_count == 1 and page_1.call_count == 1  # from the delta link, not anew
    assert tombstoned_ids(sync_engine, conn_id, "drive_items") == {VALVE_SCHEDULE}
    assert live_ids(sync_engine, conn_id, "drive_items") == FIRST_IDS - {VALVE_SCHEDULE} | {MARKUP}
    assert saved_cursor(sync_engine, conn_id) == {"delta_link": CHANGES_LINK}
    # The token saved by the first sync is still good: no new one is asked for.
    assert tokens.call_count == 1
    assert changes.calls.last.request.headers["authorization"] == "Bearer graph-token-1"


def test_an_enumeration_from_the_start_tombstones_items_an_unfinished_sync_left(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    respx_mock.get(DELTA).mock(return_value=graph(PAGE_1))
    page_2 = delta_route(respx_mock, NEXT_LINK).mock(
        return_value=graph(fixture("msgraph", "delta_page2.json"))
    )
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    # What a first sync cancelled before its delta link leaves: items and no cursor.
    with sync_engine.pool.connection() as conn:
        conn.execute("DELETE FROM table_state WHERE connection_id = %s", (conn_id,))
    # Meanwhile the valve schedule was deleted; an enumeration from the start lists live
    # items only, so it is simply absent.
    without = fixture("msgraph", "delta_page2.json")
    without["value"] = [item for item in without["value"] if item["id"] != VALVE_SCHEDULE]
    page_2.mock(return_value=graph(without))

    run = run_sync(sync_engine, conn_id)
    assert plain(run.results) == {"drive_items": result(unchanged=4, tombstoned=1)}
    assert tombstoned_ids(sync_engine, conn_id, "drive_items") == {VALVE_SCHEDULE}
    assert live_ids(sync_engine, conn_id, "drive_items") == FIRST_IDS - {VALVE_SCHEDULE}


@pytest.mark.parametrize("with_location", [True, False], ids=["location", "no-location"])
def test_a_410_on_the_delta_link_resyncs_and_tombstones_what_is_gone(
    sync_engine: Engine, respx_mock: respx.MockRouter, with_location: bool
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    fresh = f"{DELTA}?token=fresh-enumeration-after-410"
    headers = {"Location": fresh} if with_location else {}
    gone = delta_route(respx_mock, DELTA_LINK).mock(
        return_value=graph(fixture("msgraph", "resync_required.json"), 410, headers)
    )
    page_1 = fixture("msgraph", "delta_page1.json")
    if with_location:
        restart = delta_route(respx_mock, fresh).mock(return_value=graph(page_1))
    # The drive as it is now: the site plan is gone (and no deletion was reported for it).
    now_page_2 = fixture("msgraph", "delta_page2.json")
    now_page_2["value"] = [i for i in now_page_2["value"] if i["id"] != SITE_PLAN]
    now_page_2["@odata.deltaLink"] = CHANGES_LINK
    delta_route(respx_mock, NEXT_LINK).mock(
        side_effect=[graph(fixture("msgraph", "delta_page2.json")), graph(now_page_2)]
    )
    start = respx_mock.get(DELTA).mock(return_value=graph(page_1))
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert gone.call_count == 1
    # With a Location the enumeration restarts there; without, from the start.
    assert start.call_count == (1 if with_location else 2)
    if with_location:
        assert restart.call_count == 1
    assert plain(run.results) == {"drive_items": result(unchanged=4, tombstoned=1)}
    assert tombstoned_ids(sync_engine, conn_id, "drive_items") == {SITE_PLAN}
    assert saved_cursor(sync_engine, conn_id) == {"delta_link": CHANGES_LINK}


def test_a_long_retry_after_requeues_the_run_at_that_time(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    respx_mock.get(DELTA).mock(
        return_value=graph(fixture("msgraph", "throttled.json"), 429, {"Retry-After": "600"})
    )
    conn_id = connect(sync_engine)
    before = now()
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert (run.attempts, run.waits) == (0, 1)  # a wait spends no attempt
    assert abs(requeued_in(run, after=before) - 600) <= 2
    assert run.results["drive_items"]["error"]["kind"] == "rate_limited"
    assert saved_cursor(sync_engine, conn_id) is None


@pytest.mark.parametrize("status", [429, 503])
def test_a_short_retry_after_is_slept_inside_the_run(
    sync_engine: Engine, respx_mock: respx.MockRouter, status: int
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    delta_route(respx_mock, NEXT_LINK).mock(
        side_effect=[
            graph(fixture("msgraph", "throttled.json"), status, {"Retry-After": "1"}),
            graph(fixture("msgraph", "delta_page2.json")),
        ]
    )
    respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page1.json")))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded" and run.attempts == 1
    assert plain(run.results) == {"drive_items": result(upserted=5)}


def test_an_expired_token_is_refreshed_mid_sync_saved_and_reused(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    tokens = respx_mock.post(TOKEN_URL).mock(
        side_effect=[token("graph-token-1"), token("graph-token-2")]
    )
    expired = graph(
        fixture("msgraph", "token_expired.json"),
        401,
        {"WWW-Authenticate": 'Bearer realm="", error="invalid_token"'},
    )

    def page_2(request: httpx.Request) -> httpx.Response:
        if request.headers["authorization"] == "Bearer graph-token-1":
            return expired  # the token expired between page 1 and page 2
        return graph(fixture("msgraph", "delta_page2.json"))

    changes = delta_route(respx_mock, DELTA_LINK).mock(
        return_value=graph({"value": [], "@odata.deltaLink": DELTA_LINK})
    )
    second = delta_route(respx_mock, NEXT_LINK).mock(side_effect=page_2)
    respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page1.json")))
    conn_id = connect(sync_engine)

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {"drive_items": result(upserted=5)}
    assert tokens.call_count == 2 and second.call_count == 2
    saved = stored_credentials(sync_engine, conn_id)
    assert saved["access_token"] == "graph-token-2"
    assert saved["client_secret"] == CLIENT["client_secret"]

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded"
    assert changes.calls.last.request.headers["authorization"] == "Bearer graph-token-2"
    assert tokens.call_count == 2


def test_an_html_page_with_status_200_fails_the_table_and_keeps_what_was_read(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    # A proxy's sign-in page, served with 200 in place of page 2.
    delta_route(respx_mock, NEXT_LINK).mock(
        return_value=httpx.Response(
            200,
            text="<!DOCTYPE html><html><head><title>Sign in to your account</title></head></html>",
            headers={"Content-Type": "text/html; charset=utf-8"},
        )
    )
    respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page1.json")))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "failed" and run.attempts == 3
    table = run.results["drive_items"]
    assert table["status"] == "failed"
    assert "expected JSON but got text/html" in table["error"]["message"]
    assert live_ids(sync_engine, conn_id, "drive_items") == {item["id"] for item in PAGE_1["value"]}
    assert saved_cursor(sync_engine, conn_id) is None  # the next sync enumerates again


# -- offline, with FakeContext -------------------------------------------------------------


def offline(cursor: Any = None, **config: Any) -> tuple[GraphDriveConnector, FakeContext]:
    context = FakeContext(
        config=GraphDriveConfig(tenant_id=TENANT, drive_id=DRIVE, **config),
        credentials={**CLIENT, "access_token": "graph-token-1", "expires_at": 4102444800},
        cursors={"drive_items": cursor} if cursor else {},
    )
    return GraphDriveConnector(context), context


def test_deleted_facets_become_deletions_and_the_delta_link_the_checkpoint(
    respx_mock: respx.MockRouter,
) -> None:
    body = fixture("msgraph", "delta_changes.json")
    body["value"].append({"id": "01BYE5RZNOTDELETED", "name": "kept.txt", "deleted": None})
    delta_route(respx_mock, DELTA_LINK).mock(return_value=graph(body))
    connector, _ = offline({"delta_link": DELTA_LINK})
    items = read_table(connector, "drive_items")
    assert Deleted(VALVE_SCHEDULE) in items
    assert not any(isinstance(i, dict) and "deleted" in i and i["deleted"] for i in items)
    assert items[-1] == Checkpoint({"delta_link": CHANGES_LINK}, partition=DRIVE)
    assert sum(isinstance(i, dict) for i in items) == 4  # a null facet is not a deletion


def test_a_second_410_in_a_row_is_a_permanent_error(respx_mock: respx.MockRouter) -> None:
    gone = graph(fixture("msgraph", "resync_required.json"), 410)
    delta_route(respx_mock, DELTA_LINK).mock(return_value=gone)
    start = respx_mock.get(DELTA).mock(return_value=gone)
    connector, _ = offline({"delta_link": DELTA_LINK})
    items: list[Any] = []
    with pytest.raises(PermanentError, match="410 Gone"):
        for item in connector.read_partition(connector.tables[0], DRIVE):
            items.append(item)
    assert items == [Resync()] and start.call_count == 1


def test_a_location_on_another_host_is_not_followed(respx_mock: respx.MockRouter) -> None:
    delta_route(respx_mock, DELTA_LINK).mock(
        return_value=graph(
            fixture("msgraph", "resync_required.json"),
            410,
            {"Location": "https://graph.evil.example/v1.0/steal"},
        )
    )
    start = respx_mock.get(DELTA).mock(
        return_value=graph({"value": [], "@odata.deltaLink": CHANGES_LINK})
    )
    connector, _ = offline({"delta_link": DELTA_LINK})
    assert read_table(connector, "drive_items") == [
        Resync(),
        Checkpoint({"delta_link": CHANGES_LINK}, partition=DRIVE),
    ]
    assert start.calls.last.request.headers["authorization"] == "Bearer graph-token-1"


def test_a_sovereign_cloud_is_a_matter_of_config(respx_mock: respx.MockRouter) -> None:
    # Microsoft Graph for US Government: another Graph host and another login host.
    tokens = respx_mock.post(f"https://login.microsoftonline.us/{TENANT}/oauth2/v2.0/token").mock(
        return_value=token("gov-token")
    )
    respx_mock.get(f"https://graph.microsoft.us/v1.0/drives/{DRIVE}/root/delta").mock(
        return_value=graph({"value": [], "@odata.deltaLink": CHANGES_LINK})
    )
    context = FakeContext(
        config=GraphDriveConfig(
            tenant_id=TENANT,
            drive_id=DRIVE,
            base_url="https://graph.microsoft.us/v1.0",
            token_url="https://login.microsoftonline.us/{tenant_id}/oauth2/v2.0/token",
            scope="https://graph.microsoft.us/.default",
        ),
        credentials=CLIENT,
    )
    connector = GraphDriveConnector(context)
    assert read_table(connector, "drive_items") == [
        Resync(),  # a first enumeration is the whole drive
        Checkpoint({"delta_link": CHANGES_LINK}, partition=DRIVE),
    ]
    assert parse_qs(tokens.calls.last.request.content.decode())["scope"] == [
        "https://graph.microsoft.us/.default"
    ]
    assert context.credentials["access_token"] == "gov-token"
