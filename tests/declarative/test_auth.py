"""Each kind of auth a provider file declares sends the credentials as the provider's docs say,
filled from the connection's credentials, and never shows them in an error."""

from __future__ import annotations

import base64
import time
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from connectors.errors import PermanentError
from tests.declarative.helpers import API, open_connector, read_table, rows

TOKEN_URL = "https://login.tiny.example/oauth/token"


def provider(auth: str, credentials: str) -> str:
    return f"""
provider: tiny
config: {{base_url: {{type: string}}}}
credentials: {credentials}
base_url: "{{config.base_url}}"
auth: {auth}
tables:
  - name: users
    path: /users
"""


def test_bearer(respx_mock: Any) -> None:
    route = respx_mock.get(f"{API}/users").respond(json=[{"id": 1}])
    connector, _ = open_connector(
        provider('{type: bearer, token: "{credentials.token}"}', "{token: {type: string}}"),
        credentials={"token": "t0k3n"},
    )
    assert rows(read_table(connector, "users")) == [{"id": 1}]
    assert route.calls.last.request.headers["authorization"] == "Bearer t0k3n"


def test_basic(respx_mock: Any) -> None:
    route = respx_mock.get(f"{API}/users").respond(json=[{"id": 1}])
    connector, _ = open_connector(
        provider(
            '{type: basic, username: "{credentials.email}/token", password: "{credentials.key}"}',
            "{email: {type: string}, key: {type: string}}",
        ),
        credentials={"email": "ada@tiny.example", "key": "s3cr3t"},
    )
    read_table(connector, "users")
    sent = route.calls.last.request.headers["authorization"]
    assert sent == "Basic " + base64.b64encode(b"ada@tiny.example/token:s3cr3t").decode()


def test_api_key_in_a_header(respx_mock: Any) -> None:
    route = respx_mock.get(f"{API}/users").respond(json=[{"id": 1}])
    connector, _ = open_connector(
        provider(
            '{type: api_key, name: X-Api-Key, value: "{credentials.key}"}',
            "{key: {type: string}}",
        ),
        credentials={"key": "k-123"},
    )
    read_table(connector, "users")
    request = route.calls.last.request
    assert request.headers["x-api-key"] == "k-123" and "authorization" not in request.headers


def test_api_key_in_the_query_never_in_an_error(respx_mock: Any) -> None:
    route = respx_mock.get(f"{API}/users").respond(403, json={"message": "forbidden"})
    connector, _ = open_connector(
        provider(
            '{type: api_key, in: query, name: api_key, value: "{credentials.key}"}',
            "{key: {type: string}}",
        ),
        credentials={"key": "k-123"},
    )
    with pytest.raises(PermanentError) as failed:
        read_table(connector, "users")
    assert route.calls.last.request.url.params["api_key"] == "k-123"
    assert "k-123" not in str(failed.value)


def test_oauth2_client_credentials(respx_mock: Any) -> None:
    token = respx_mock.post(TOKEN_URL).respond(
        json={"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600}
    )
    api = respx_mock.get(f"{API}/users").respond(json=[{"id": 1}])
    connector, context = open_connector(
        provider(f"{{type: oauth2, token_url: '{TOKEN_URL}', scope: read}}", "{}"),
        credentials={"client_id": "app", "client_secret": "shh"},
    )
    read_table(connector, "users")
    form = parse_qs(token.calls.last.request.content.decode())
    assert form["grant_type"] == ["client_credentials"] and form["client_id"] == ["app"]
    assert api.calls.last.request.headers["authorization"] == "Bearer at-1"
    assert context.credentials["access_token"] == "at-1"  # saved by the engine


def test_oauth2_refresh_keeps_a_rotated_refresh_token(respx_mock: Any) -> None:
    token = respx_mock.post(TOKEN_URL).respond(
        json={"access_token": "at-2", "refresh_token": "rt-2", "expires_in": 3600}
    )
    respx_mock.get(f"{API}/users").mock(
        side_effect=lambda request: httpx.Response(
            200 if request.headers["authorization"] == "Bearer at-2" else 401, json=[{"id": 1}]
        )
    )
    connector, context = open_connector(
        provider(f"{{type: oauth2, grant: refresh_token, token_url: '{TOKEN_URL}'}}", "{}"),
        credentials={
            "client_id": "app",
            "client_secret": "shh",
            "refresh_token": "rt-1",
            "access_token": "at-1",
            "expires_at": time.time() + 3600,
        },
    )
    assert rows(read_table(connector, "users")) == [{"id": 1}]  # 401, refresh, again
    assert parse_qs(token.calls.last.request.content.decode())["refresh_token"] == ["rt-1"]
    assert context.credentials["refresh_token"] == "rt-2"
