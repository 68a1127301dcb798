"""The OAuth token endpoint is a provider too: a 429 or 503 from it is a rate limit whose
Retry-After wins, never a disconnect; only a refused grant or client disconnects; an access
token the API refused is never sent again. Microsoft's identity platform (client credentials,
for Graph) and Procore's (rotating refresh tokens), mocked as their docs answer."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx

from connectors.errors import AuthError, ConnectorError, PermanentError, RetryableError
from connectors.msgraph import GraphDriveConfig, GraphDriveConnector
from connectors.testing import FakeContext, read_table
from sync import Engine
from sync.testing import make_run_due, run_sync
from tests.conftest import make_settings
from tests.connectors.helpers import fixture, json_response, stored_credentials
from tests.connectors.test_msgraph import CLIENT, DELTA, DRIVE, TENANT, TOKEN_URL, graph, token
from tests.connectors.test_procore import CLIENT as PROCORE_CLIENT
from tests.connectors.test_procore import COMPANIES, PROJECTS, procore
from tests.connectors.test_procore import TOKEN_URL as PROCORE_TOKEN_URL

# What Microsoft's identity platform answers a client that asks too often.
THROTTLED = {
    "error": "temporarily_unavailable",
    "error_description": "AADSTS50196: The server terminated an operation because it "
    "encountered a client request loop.",
    "error_codes": [50196],
}


def delta_page() -> httpx.Response:
    return graph(fixture("msgraph", "delta_changes.json"))


def graph_connection(engine: Engine) -> int:
    ws = engine.create_workspace("contoso")
    return engine.create_connection(
        ws.id,
        "docs",
        "msgraph_drive",
        config={"tenant_id": TENANT, "drive_id": DRIVE},
        credentials=CLIENT,
    ).id


@pytest.mark.parametrize(("status", "wait"), [(429, 2), (503, 5)], ids=["429", "503"])
def test_a_throttled_token_endpoint_is_waited_for_inside_the_run(
    respx_mock: respx.MockRouter, status: int, wait: int
) -> None:
    order: list[str] = []
    context = FakeContext(
        config=GraphDriveConfig(tenant_id=TENANT, drive_id=DRIVE), credentials=dict(CLIENT)
    )
    real_sleep = context.sleep

    def sleep(seconds: float) -> None:
        order.append(f"sleep {seconds:g}")
        real_sleep(seconds)

    context.sleep = sleep  # type: ignore[method-assign]

    def answer(request: httpx.Request) -> httpx.Response:
        order.append("token")
        if order.count("token") == 1:
            return json_response(THROTTLED, status, {"Retry-After": str(wait)})
        return token("graph-token-1")

    respx_mock.post(TOKEN_URL).mock(side_effect=answer)
    respx_mock.get(DELTA).mock(return_value=delta_page())
    items = read_table(GraphDriveConnector(context), "drive_items")
    assert items  # the enumeration went on
    # The second token request came only after the wait the endpoint asked for.
    assert order == ["token", f"sleep {wait}", "token"]
    assert context.rate_limit_waits == [wait]
    # Short, so slept inside the run; reported all the same, so no other job of the budget
    # sends a request inside the window.
    assert [reason for _, reason in context.rate_limits] == [
        f"the token endpoint answered {status}: rate limited"
    ]


# What Microsoft's identity platform answers a token request it will not grant (RFC 6749
# section 5.2: a failed client authentication may be a 401), and what the run makes of it.
AADSTS = "AADSTS7000215: Invalid client secret provided."
REFUSED_ANSWERS = {
    "invalid_client 401": (
        lambda: json_response({"error": "invalid_client", "error_description": AADSTS}, 401),
        AuthError,
    ),
    "unauthorized_client 400": (
        lambda: json_response(
            {
                "error": "unauthorized_client",
                "error_description": "AADSTS700016: Application with identifier '6731de76' "
                "was not found in the directory 'contoso'.",
            },
            400,
        ),
        AuthError,
    ),
    "401 without a body": (lambda: httpx.Response(401), AuthError),
    "invalid_scope 400": (
        lambda: json_response(
            {"error": "invalid_scope", "error_description": "AADSTS70011: The scope is invalid."},
            400,
        ),
        PermanentError,
    ),
    "500": (lambda: httpx.Response(500, text="<html>Server Error</html>"), RetryableError),
    "network error": (httpx.ConnectError("connection refused"), RetryableError),
}


@pytest.mark.parametrize("answer", list(REFUSED_ANSWERS), ids=list(REFUSED_ANSWERS))
def test_a_refused_client_disconnects_and_any_other_failure_does_not(
    respx_mock: respx.MockRouter, answer: str
) -> None:
    reply, expected = REFUSED_ANSWERS[answer]
    route = respx_mock.post(TOKEN_URL)
    if isinstance(reply, Exception):
        route.mock(side_effect=reply)
    else:
        route.mock(return_value=reply())
    context = FakeContext(
        config=GraphDriveConfig(tenant_id=TENANT, drive_id=DRIVE), credentials=dict(CLIENT)
    )
    with pytest.raises(ConnectorError) as raised:
        read_table(GraphDriveConnector(context), "drive_items")
    assert type(raised.value) is expected, raised.value
    assert CLIENT["client_secret"] not in str(raised.value)


def test_a_long_throttle_waits_in_the_queue_and_the_connection_stays_active(
    schema: str, respx_mock: respx.MockRouter
) -> None:
    # Inline waits of at most a second: the token endpoint's 2 s are waited for in the queue.
    with Engine(make_settings(schema, max_inline_wait=1.0)) as engine:
        engine.migrate()
        throttled_at: list[datetime] = []

        def answer(request: httpx.Request) -> httpx.Response:
            if not throttled_at:
                throttled_at.append(datetime.now(UTC))
                return json_response(THROTTLED, 429, {"Retry-After": "2"})
            return token("graph-token-1")

        tokens = respx_mock.post(TOKEN_URL).mock(side_effect=answer)
        respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page2.json")))
        conn_id = graph_connection(engine)
        run = run_sync(engine, conn_id, skip_retry_waits=False)
        assert run.status == "queued" and (run.attempts, run.waits) == (0, 1)
        assert engine.connection(conn_id).status == "active"
        assert run.waiting_until is not None  # not a moment sooner than the endpoint asked
        assert (run.waiting_until - throttled_at[0]).total_seconds() >= 2
        assert tokens.call_count == 1

        assert make_run_due(engine, run.id)
        done = run_sync(engine, conn_id)
        assert done.status == "succeeded", done.error
        assert tokens.call_count == 2
        assert engine.connection(conn_id).status == "active"


def test_a_refused_grant_disconnects_after_one_attempt_and_says_nothing_secret(
    sync_engine: Engine, respx_mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = respx_mock.post(PROCORE_TOKEN_URL).mock(
        return_value=json_response(fixture("procore", "invalid_grant.json"), 400)
    )
    credentials = {
        **PROCORE_CLIENT,
        "access_token": "at-expired-0f3c",
        "refresh_token": "rt-revoked-9d2e",
        "expires_at": time.time() - 60,
    }
    ws = sync_engine.create_workspace("vertex")
    conn_id = sync_engine.create_connection(
        ws.id, "procore", "procore", config={"company_id": 8089}, credentials=credentials
    ).id
    with caplog.at_level(logging.DEBUG):
        run = run_sync(sync_engine, conn_id)
    assert run.status == "failed" and run.attempts == 1
    assert run.error is not None and run.error.kind == "auth"
    assert "invalid_grant" in run.error.message
    assert sync_engine.connection(conn_id).status == "disconnected"
    assert tokens.call_count == 1
    said = " ".join([caplog.text, repr(run), *(repr(a) for a in sync_engine.attempts(run.id))])
    for secret in (*credentials.values(),):
        if isinstance(secret, str) and len(secret) > 8:
            assert secret not in said


def test_a_refused_access_token_is_never_sent_again(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    seen: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        if request.headers["authorization"] == "Bearer at-0":
            return json_response(fixture("procore", "unauthorized.json"), 401)
        return procore([], total=0)

    respx_mock.get(COMPANIES).mock(side_effect=api)
    respx_mock.get(PROJECTS).mock(side_effect=api)
    # The refresh after the 401 fails on the endpoint's side (for the three tables of the first
    # attempt), then works.
    body = {**fixture("procore", "token.json"), "access_token": "at-1", "refresh_token": "rt-1"}
    failing = json_response({"errors": "Internal Server Error"}, 500)
    tokens = respx_mock.post(PROCORE_TOKEN_URL).mock(
        side_effect=[failing, failing, failing, json_response(body)]
    )
    ws = sync_engine.create_workspace("vertex")
    conn_id = sync_engine.create_connection(
        ws.id,
        "procore",
        "procore",
        config={"company_id": 8089},
        credentials={
            **PROCORE_CLIENT,
            "access_token": "at-0",
            "refresh_token": "rt-0",
            "expires_at": time.time() + 3600,
        },
    ).id
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert run.status == "queued" and run.error is not None
    assert run.error.kind == "retryable"  # the endpoint failed: not the credentials' fault
    saved: dict[str, Any] = stored_credentials(sync_engine, conn_id)
    assert "access_token" not in saved and saved["refresh_token"] == "rt-0"
    assert sync_engine.connection(conn_id).status == "active"

    done = run_sync(sync_engine, conn_id)
    assert done.status == "succeeded", done.error
    assert tokens.call_count == 4
    assert seen.count("Bearer at-0") == 1  # the refused token was sent once, never again
    assert stored_credentials(sync_engine, conn_id)["access_token"] == "at-1"
