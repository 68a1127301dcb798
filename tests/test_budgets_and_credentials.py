"""Shared rate budgets across workers and workspaces; credential refresh under the connection
lock and behind the fence; secrets never leave the encrypted column."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
import respx
from pydantic import BaseModel

import connectors
from connectors import Connector, HttpClient, OAuth2, RetryableError, Table, register
from sync import Engine
from sync.base.abort import AbortSignal
from sync.errors import LeaseLost
from sync.jobs.budgets import BudgetView
from sync.runs.context import RunContext
from sync.store import ClaimedRun, RunStore
from sync.testing import run_sync
from tests.conftest import make_settings
from tests.test_fencing import claim
from tests.waiting import wait_until_blocked

API = "https://budget.example.test"


class AccountConfig(BaseModel):
    account: str
    pages: int = 1


@register
class BudgetedConnector(Connector[AccountConfig]):
    """Draws on one rate budget per `account`, whatever workspace the connection is in."""

    provider = "budgeted"
    tables = (Table("items"),)
    config_model = AccountConfig

    @classmethod
    def budget_key(cls, config: AccountConfig, credentials: Mapping[str, Any]) -> str | None:
        return f"account:{config.account}"

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        with HttpClient(self.context, base_url=API) as http:
            for page in range(config.pages):
                yield http.get_json(f"/{config.account}/items", params={"page": page})


def test_a_spent_budget_holds_back_every_connection_on_it(
    engine: Engine, admin: Any, respx_mock: respx.MockRouter
) -> None:
    respx_mock.get(f"{API}/A/items").mock(
        return_value=httpx.Response(429, headers={"Retry-After": "600"})
    )
    respx_mock.get(f"{API}/B/items").mock(return_value=httpx.Response(200, json=[{"id": 1}]))
    one, two = engine.create_workspace("one"), engine.create_workspace("two")
    first = engine.create_connection(one.id, "a1", "budgeted", config={"account": "A"})
    second = engine.create_connection(two.id, "a2", "budgeted", config={"account": "A"})
    other = engine.create_connection(two.id, "b", "budgeted", config={"account": "B"})
    runs = [engine.sync(c.id) for c in (first, second, other)]
    worker = engine.worker(listen=False)

    assert worker.poll()  # the first A connection meets the 429
    limited = engine.run(runs[0].id)
    assert limited.status == "queued" and limited.error.kind == "rate_limited"
    budget = admin.execute("SELECT key, blocked_until - now() AS left FROM rate_budgets").fetchone()
    assert budget["key"].startswith("budgeted:") and "A" not in budget["key"]
    assert timedelta(seconds=590) < budget["left"] <= timedelta(seconds=600)

    assert worker.poll()  # not the second A connection: the B one
    assert engine.run(runs[2].id).status == "succeeded"
    assert engine.run(runs[1].id).status == "queued" and engine.run(runs[1].id).attempts == 0
    assert worker.poll() is False  # both A runs wait for the budget

    admin.execute("UPDATE rate_budgets SET blocked_until = now() - interval '1 second'")
    admin.execute("UPDATE connection_runs SET queued_at = now() WHERE status = 'queued'")
    respx_mock.get(f"{API}/A/items").mock(return_value=httpx.Response(200, json=[{"id": 2}]))
    assert worker.poll() and worker.poll()
    assert {engine.run(r.id).status for r in runs} == {"succeeded"}


def test_a_running_sync_on_a_budget_another_run_spent_stops_and_waits(
    schema: str, admin: Any, respx_mock: respx.MockRouter
) -> None:
    settings = make_settings(schema, control_interval=0.1)
    with Engine(settings, pool_size=8) as engine:
        engine.migrate()
        spent = threading.Event()
        under_way = threading.Event()

        def provider(request: httpx.Request) -> httpx.Response:
            # Only the second connection asks for page 0 once the first is under way.
            if spent.is_set() and request.url.params["page"] == "0":
                return httpx.Response(429, headers={"Retry-After": "600"})
            if request.url.params["page"] == "2":
                under_way.set()
            return httpx.Response(200, json=[{"id": request.url.params["page"]}])

        respx_mock.get(f"{API}/A/items").mock(side_effect=provider)
        one, two = engine.create_workspace("one"), engine.create_workspace("two")
        # It reads page after page until its control read sees the budget spent, then its next
        # request gives the attempt up (the page count only bounds a broken run).
        slow = engine.create_connection(
            one.id, "slow", "budgeted", config={"account": "A", "pages": 1_000_000}
        )
        slow_run = engine.sync(slow.id)
        busy = engine.worker(listen=False)
        thread = threading.Thread(target=busy.poll)
        thread.start()
        assert under_way.wait(30)

        # Another worker, another workspace, same account: the provider says stop for 10 min.
        spent.set()
        fast = engine.create_connection(two.id, "fast", "budgeted", config={"account": "A"})
        fast_run = engine.sync(fast.id)
        assert engine.worker(listen=False).poll()
        assert engine.run(fast_run.id).status == "queued"
        thread.join(30)

        paused = engine.run(slow_run.id)
        assert paused.status == "queued" and paused.error.kind == "rate_limited"
        gap = admin.execute(
            "SELECT abs(extract(epoch FROM r.queued_at - b.blocked_until)) AS gap "
            "FROM connection_runs r, rate_budgets b WHERE r.id = %s",
            (slow_run.id,),
        ).fetchone()["gap"]
        assert float(gap) < 3  # it waits until the budget's reset, not a plain backoff


TOKEN_URL = "https://auth.example.test/oauth/token"


class OAuthConfig(BaseModel):
    pass


@register
class RotatingConnector(Connector[OAuthConfig]):
    provider = "rotating"
    tables = (Table("me"),)
    config_model = OAuthConfig

    def read(self, table: Table) -> Iterator[Any]:
        auth = OAuth2(self.context, token_url=TOKEN_URL, grant="refresh_token")
        with HttpClient(self.context, base_url=API, auth=auth) as http:
            yield http.get_json("/me")


def rotating_token_endpoint(respx_mock: respx.MockRouter, spent: list[str]) -> None:
    """Each refresh token works once and is replaced by a new one."""

    def token(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        if form["refresh_token"] in spent or not form["refresh_token"].startswith("rt-"):
            return httpx.Response(400, json={"error": "invalid_grant"})
        spent.append(form["refresh_token"])
        n = len(spent)
        return httpx.Response(
            200,
            json={
                "access_token": f"at-{n}",
                "refresh_token": f"rt-{n}",
                "token_type": "Bearer",
                "expires_in": 7200,
            },
        )

    respx_mock.post(TOKEN_URL).mock(side_effect=token)


def rotating_connection(engine: Engine, **credentials: Any) -> Any:
    """A connection whose refresh token so far is rt-0 (and whatever ``credentials`` add)."""
    ws = engine.create_workspace("acme")
    return engine.create_connection(
        ws.id,
        "r",
        "rotating",
        credentials={
            "client_id": "cid-123456",
            "client_secret": "secret-123456",
            "refresh_token": "rt-0",
            **credentials,
        },
    )


def context_for(engine: Engine, claimed: dict[str, Any]) -> RunContext:
    """The context a worker would give the connector for this claim."""
    return RunContext(
        run=ClaimedRun.from_row(claimed),
        connector_class=RotatingConnector,
        config=OAuthConfig(),
        credentials=engine.secrets.decrypt(claimed["credentials"]),
        cursors={},
        abort=AbortSignal(),
        budget=BudgetView(),
        store=RunStore(engine.pool),
        secrets=engine.secrets,
        settings=engine.settings,
        logger=logging.LoggerAdapter(logging.getLogger("test"), {}),
    )


def stored_credentials(engine: Engine, connection_id: int) -> dict[str, Any]:
    with engine.pool.connection() as conn:
        row = conn.execute(
            "SELECT credentials FROM connections WHERE id = %s", (connection_id,)
        ).fetchone()
    return engine.secrets.decrypt(row["credentials"])


def test_a_rotated_refresh_token_is_saved_and_spent_next(
    engine: Engine, respx_mock: respx.MockRouter
) -> None:
    spent: list[str] = []
    rotating_token_endpoint(respx_mock, spent)
    me = respx_mock.get(f"{API}/me").mock(return_value=httpx.Response(200, json={"id": "u1"}))
    conn = rotating_connection(
        engine,
        access_token="at-0",
        expires_at=time.time() - 10,  # already expired
    )
    assert run_sync(engine, conn.id).status == "succeeded"
    assert spent == ["rt-0"]
    saved = stored_credentials(engine, conn.id)
    assert (saved["access_token"], saved["refresh_token"]) == ("at-1", "rt-1")
    assert me.calls.last.request.headers["authorization"] == "Bearer at-1"

    # The next sync reuses the saved token while it is valid, and spends rt-1 when it is not.
    assert run_sync(engine, conn.id).status == "succeeded"
    assert spent == ["rt-0"]
    with engine.pool.connection() as db:
        saved["expires_at"] = time.time() - 10
        db.execute(
            "UPDATE connections SET credentials = %s WHERE id = %s",
            (engine.secrets.encrypt(saved), conn.id),
        )
    assert run_sync(engine, conn.id).status == "succeeded"
    assert spent == ["rt-0", "rt-1"]
    assert stored_credentials(engine, conn.id)["refresh_token"] == "rt-2"


def test_a_stale_claim_never_spends_the_refresh_token(
    engine: Engine, admin: Any, respx_mock: respx.MockRouter
) -> None:
    spent: list[str] = []
    rotating_token_endpoint(respx_mock, spent)
    conn = rotating_connection(engine)
    engine.sync(conn.id)
    stale_row = claim(engine, "worker-a")
    admin.execute("UPDATE connection_runs SET lease_expires_at = now() - interval '1 second'")
    live_row = claim(engine, "worker-b")

    stale = OAuth2(context_for(engine, stale_row), token_url=TOKEN_URL, grant="refresh_token")
    live = OAuth2(context_for(engine, live_row), token_url=TOKEN_URL, grant="refresh_token")
    with pytest.raises(LeaseLost):
        stale.refresh()
    assert spent == []  # fenced before the token endpoint was called
    assert live.refresh() is True
    assert spent == ["rt-0"]
    assert stored_credentials(engine, conn.id)["refresh_token"] == "rt-1"


def test_refreshes_and_credential_updates_take_turns_on_the_row_lock(
    engine: Engine, respx_mock: respx.MockRouter
) -> None:
    conn = rotating_connection(engine)
    engine.sync(conn.id)
    context = context_for(engine, claim(engine, "worker-a"))
    order: list[str] = []
    inside = threading.Event()

    def slow_refresh(current: Mapping[str, Any]) -> Mapping[str, Any]:
        inside.set()
        wait_until_blocked(engine.settings.schema_name)  # the update waits for the row lock
        order.append("refresh")
        return {**current, "refresh_token": "rt-from-run"}

    thread = threading.Thread(target=context.refresh_credentials, args=(slow_refresh,))
    thread.start()
    assert inside.wait(10)
    engine.update_credentials(
        conn.id,
        {"client_id": "cid-123456", "client_secret": "s-654321", "refresh_token": "rt-from-user"},
    )
    order.append("update")
    thread.join(10)
    assert order == ["refresh", "update"]
    assert stored_credentials(engine, conn.id)["refresh_token"] == "rt-from-user"


CANARY = f"canary-{uuid.uuid4().hex}"


@register
class LeakyConnector(Connector[OAuthConfig]):
    """Does everything a careless connector could do with a secret, short of storing it as
    data: logs it, raises with it, sends it in a URL."""

    provider = "leaky"
    tables = (Table("items"),)
    config_model = OAuthConfig

    def read(self, table: Table) -> Iterator[Any]:
        self.context.logger.info("credentials are %s", dict(self.context.credentials))
        yield {"id": 1, "note": "fine"}
        try:
            raise ValueError(f"token {self.context.credentials['token']} refused")
        except ValueError:
            self.context.logger.exception("while calling the API")
        raise RetryableError(f"upstream rejected {self.context.credentials['token']}")


def test_a_canary_secret_appears_nowhere_but_encrypted(
    engine: Engine, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "leak", "leaky", credentials={"token": CANARY})
    with caplog.at_level(logging.DEBUG):
        run = run_sync(engine, conn.id)
    assert run.status == "failed"
    assert "[redacted]" in run.error.message
    assert CANARY not in caplog.text and "[redacted]" in caplog.text
    assert CANARY not in repr(run) and CANARY not in repr(engine.connection(conn.id))

    tables = [
        r["tablename"]
        for r in admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    ]
    assert "connections" in tables and "run_attempts" in tables
    for table in tables:
        dump = admin.execute(
            psycopg.sql.SQL("SELECT coalesce(string_agg(t::text, ' '), '') AS d FROM {} t").format(
                psycopg.sql.Identifier(table)
            )
        ).fetchone()["d"]
        assert CANARY not in dump, table
        assert CANARY.encode().hex() not in dump, table  # not even as raw bytea
    assert (
        engine.secrets.decrypt(
            admin.execute("SELECT credentials FROM connections").fetchone()["credentials"]
        )["token"]
        == CANARY
    )


def test_budget_keys_are_hashed(engine: Engine, admin: Any) -> None:
    ws = engine.create_workspace("acme")
    engine.create_connection(ws.id, "a", "budgeted", config={"account": "secret-account"})
    key = admin.execute("SELECT budget_key FROM connections").fetchone()["budget_key"]
    assert key.startswith("budgeted:") and "secret-account" not in key
    assert connectors.get("budgeted") is BudgetedConnector
