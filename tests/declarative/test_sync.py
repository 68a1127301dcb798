"""A declared provider synced by the engine: partitions from a parent table's rows (each its own
slice: one that fails fails alone; one whose parent row is gone has its rows tombstoned),
incremental cursors (withheld while the table's deletions need a complete listing, given to a
feed), deletions (a marker, a deletion feed, a complete listing)."""

from __future__ import annotations

from typing import Any

import httpx

from sync import Engine
from sync.testing import run_sync
from tests.declarative.helpers import API

TINY = """
provider: tiny_api
config: {base_url: {type: string}}
credentials: {token: {type: string}}
base_url: "{config.base_url}"
auth: {type: bearer, token: "{credentials.token}"}
paginator: {type: link_header}
tables:
  - name: users
    path: /users
    records: data
    primary_key: id
  - name: orders
    path: /users/{users.id}/orders
    primary_key: id
    incremental: {cursor_field: updated_at, param: since}
"""


def connect(engine: Engine, text: str, name: str = "tiny") -> int:
    engine.add_provider(text)
    ws = engine.workspaces()[0] if engine.workspaces() else engine.create_workspace("w")
    provider = text.split("provider:", 1)[1].split()[0]
    return engine.create_connection(
        ws.id, name, provider, config={"base_url": API}, credentials={"token": "t"}
    ).id


def live(engine: Engine, conn_id: int, table: str) -> dict[str, Any]:
    return {r.external_id: r.data for r in engine.records(conn_id, table)}


def gone(engine: Engine, conn_id: int, table: str) -> set[str]:
    found = engine.records(conn_id, table, include_deleted=True)
    return {r.external_id for r in found if r.deleted_at is not None}


class Shop:
    """Users and their orders, as the issue's example API serves them."""

    def __init__(self, respx_mock: Any) -> None:
        self.users = [{"id": 1}, {"id": 2}, {"id": 3}]
        self.orders: dict[int, list[dict[str, Any]]] = {
            1: [{"id": 10, "updated_at": "2026-01-01"}, {"id": 11, "updated_at": "2026-01-03"}],
            2: [{"id": 20, "updated_at": "2026-01-02"}],
            3: [],
        }
        self.failing: set[int] = set()
        self.asked: list[httpx.URL] = []
        respx_mock.get(f"{API}/users").mock(
            side_effect=lambda r: httpx.Response(200, json={"data": self.users})
        )
        respx_mock.get(url__regex=rf"^{API}/users/\d+/orders").mock(side_effect=self.orders_of)

    def orders_of(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url)
        user = int(request.url.path.split("/")[2])
        if user in self.failing:
            return httpx.Response(404, json={"message": "Not Found"})
        since = request.url.params.get("since")
        found = [o for o in self.orders.get(user, []) if since is None or o["updated_at"] >= since]
        return httpx.Response(200, json=found)


def test_one_partition_per_parent_row_each_its_own_slice(engine: Engine, respx_mock: Any) -> None:
    shop = Shop(respx_mock)
    conn = connect(engine, TINY)

    run = run_sync(engine, conn)
    assert run.status == "succeeded", run.error
    assert set(run.results["orders"]["partitions"]) == {"1", "2", "3"}
    assert set(live(engine, conn, "orders")) == {"10", "11", "20"}
    # The children's partitions came from the parent's own read: no second listing of users.
    assert sum(1 for c in respx_mock.calls if c.request.url.path == "/users") == 1

    # User 2's orders answer 404: only that slice fails, the others are synced.
    shop.failing = {2}
    shop.orders[1].append({"id": 12, "updated_at": "2026-01-04"})
    run = run_sync(engine, conn)
    assert run.status == "partial"
    assert run.results["orders"]["partitions"]["2"]["status"] == "failed"
    assert "12" in live(engine, conn, "orders") and "20" in live(engine, conn, "orders")

    # User 1 is gone from the parent listing: its orders are tombstoned with it.
    shop.failing = set()
    shop.users = [{"id": 2}, {"id": 3}]
    run = run_sync(engine, conn)
    assert run.status == "succeeded", run.error
    assert gone(engine, conn, "orders") == {"10", "11", "12"}
    assert gone(engine, conn, "users") == {"1"}


def test_a_cursor_is_withheld_while_deletions_need_a_complete_listing(
    engine: Engine, respx_mock: Any, admin: Any
) -> None:
    shop = Shop(respx_mock)
    conn = connect(engine, TINY)
    assert run_sync(engine, conn).status == "succeeded"
    assert run_sync(engine, conn).status == "succeeded"
    # orders has no deletion feed: every sync lists it whole (no since), so a deletion is
    # found by the next sync.
    assert all("since" not in url.params for url in shop.asked)
    del shop.orders[1][0]
    assert run_sync(engine, conn).status == "succeeded"
    assert gone(engine, conn, "orders") == {"10"}
    # The cursor of each partition is saved (the largest updated_at read), for an operator's
    # complete_every.
    saved = admin.execute(
        "SELECT cursor FROM table_state WHERE connection_id = %s AND table_name = 'orders'",
        (conn,),
    ).fetchone()
    assert saved["cursor"] == {"1": {"since": "2026-01-03"}, "2": {"since": "2026-01-02"}}


FEED = """
provider: feed_api
config: {base_url: {type: string}}
credentials: {token: {type: string}}
base_url: "{config.base_url}"
auth: {type: bearer, token: "{credentials.token}"}
tables:
  - name: tickets
    path: /tickets
    records: tickets
    params: {sort: updated_at}
    incremental: {cursor_field: updated_at, param: start_time}
    deleted: {field: status, value: deleted}
  - name: contacts
    path: /contacts
    records: contacts
    incremental: {cursor_field: modified, param: modified_since}
    deletions: {path: /contacts/deleted, records: deleted, id_field: contact_id}
"""


def test_a_feed_gets_its_cursor_and_reports_deletions(engine: Engine, respx_mock: Any) -> None:
    tickets = [
        {"id": 1, "status": "open", "updated_at": 100},
        {"id": 2, "status": "open", "updated_at": 200},
    ]
    contacts = [
        {"id": 7, "modified": "2026-01-01T00:00:00Z"},
        {"id": 8, "modified": "2026-01-02T00:00:00Z"},
    ]
    deleted_contacts: list[dict[str, Any]] = []

    def answer_tickets(request: httpx.Request) -> httpx.Response:
        since = int(request.url.params.get("start_time", "0"))
        return httpx.Response(
            200, json={"tickets": [t for t in tickets if t["updated_at"] >= since]}
        )

    def answer_contacts(request: httpx.Request) -> httpx.Response:
        since = request.url.params.get("modified_since", "")
        return httpx.Response(
            200, json={"contacts": [c for c in contacts if c["modified"] >= since]}
        )

    tickets_route = respx_mock.get(f"{API}/tickets").mock(side_effect=answer_tickets)
    respx_mock.get(f"{API}/contacts").mock(side_effect=answer_contacts)
    feed = respx_mock.get(f"{API}/contacts/deleted").mock(
        side_effect=lambda r: httpx.Response(200, json={"deleted": deleted_contacts})
    )
    conn = connect(engine, FEED, "feed")

    first = run_sync(engine, conn)
    assert first.status == "succeeded", first.error
    assert "start_time" not in tickets_route.calls.last.request.url.params  # the whole table
    assert not feed.called  # a complete listing needs no deletion feed

    # Ticket 2 is deleted (soft, marked), ticket 3 is new; contact 7 is deleted.
    tickets[1] = {"id": 2, "status": "deleted", "updated_at": 300}
    tickets.append({"id": 3, "status": "open", "updated_at": 300})
    del contacts[0]
    deleted_contacts.append({"contact_id": 7, "deleted_at": "2026-01-05T00:00:00Z"})
    second = run_sync(engine, conn)
    assert second.status == "succeeded", second.error
    assert tickets_route.calls.last.request.url.params["start_time"] == "200"
    assert feed.calls.last.request.url.params["modified_since"] == "2026-01-02T00:00:00Z"
    assert gone(engine, conn, "tickets") == {"2"} and set(live(engine, conn, "tickets")) == {
        "1",
        "3",
    }
    assert gone(engine, conn, "contacts") == {"7"}
    assert second.results["tickets"]["tombstoned"] == 1


def test_marked_rows_of_a_full_table_are_tombstoned(engine: Engine, respx_mock: Any) -> None:
    text = FEED.replace(
        "    incremental: {cursor_field: updated_at, param: start_time}\n", ""
    ).split("  - name: contacts")[0]
    rows = [{"id": 1, "status": "open"}, {"id": 2, "status": "open"}]
    respx_mock.get(f"{API}/tickets").mock(
        side_effect=lambda r: httpx.Response(200, json={"tickets": rows})
    )
    conn = connect(engine, text, "full")
    assert run_sync(engine, conn).status == "succeeded"
    rows[1] = {"id": 2, "status": "deleted"}
    run = run_sync(engine, conn)
    assert run.status == "succeeded" and run.results["tickets"]["tombstoned"] == 1
    assert gone(engine, conn, "tickets") == {"2"}
