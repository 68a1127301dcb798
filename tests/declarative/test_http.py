"""A declared provider's own HTTP rules: its rate-limit headers spend and wait for the shared
budget, its retried statuses are retried and the others are not, unchanged pages cost a 304,
and no URL leaves base_url's host, wherever it came from (a config value, a parent row, a next
link, a redirect)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from connectors.declarative.policy import classify
from connectors.declarative.spec import RateLimit, Retry
from connectors.errors import PermanentError, RateLimited, RetryableError
from connectors.http_policy import Verdict
from tests.declarative.helpers import API, open_connector, read_table, rows

RULES = """
provider: tiny
config: {base_url: {type: string}, path: {type: string, default: users}}
base_url: "{config.base_url}"
paginator: {type: link_header}
rate_limit:
  remaining_header: X-RateLimit-Remaining
  reset_header: X-RateLimit-Reset
retry: {statuses: [502, 520]}
tables:
  - name: users
    path: /{config.path}
"""
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def response(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", API))


def test_the_classification_the_rules_give() -> None:
    rules = RateLimit(remaining_header="x-remaining", reset_header="x-reset")
    retry = Retry(statuses=[502, 520])
    reset = str(int(NOW.timestamp()) + 90)

    def verdict(status: int, **headers: str) -> tuple[Verdict, float | None] | None:
        found = classify(response(status, **headers), NOW, rules, retry)
        return None if found is None else (found.verdict, found.wait)

    assert verdict(429, **{"retry-after": "7"}) == (Verdict.RATE_LIMITED, 7.0)
    assert verdict(429, **{"x-reset": reset}) == (Verdict.RATE_LIMITED, 90.0)
    assert verdict(403, **{"x-remaining": "0", "x-reset": reset}) == (Verdict.RATE_LIMITED, 90.0)
    assert verdict(403, **{"x-remaining": "12"}) is None  # a refusal: the standard rules
    assert verdict(520) == (Verdict.TRANSIENT, None)
    assert verdict(500) == (Verdict.PERMANENT, None)  # not among the retried statuses
    assert verdict(401) is None and verdict(404) is None
    assert classify(response(500), NOW, None, None) is None  # no rules: the standard ones


def test_a_spent_budget_is_reported_until_the_reset(respx_mock: Any) -> None:
    reset = int(datetime.now(UTC).timestamp()) + 600
    respx_mock.get(f"{API}/users").respond(
        json=[{"id": 1}],
        headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)},
    )
    connector, context = open_connector(RULES)

    assert rows(read_table(connector, "users")) == [{"id": 1}]
    ((until, reason),) = context.rate_limits
    assert abs(until.timestamp() - reset) < 2 and "X-RateLimit-Remaining" in reason


def test_a_rate_limit_past_the_inline_wait_ends_the_attempt_with_the_reset(
    respx_mock: Any,
) -> None:
    reset = int((datetime.now(UTC) + timedelta(minutes=20)).timestamp())
    respx_mock.get(f"{API}/users").respond(
        429, headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)}
    )
    connector, _ = open_connector(RULES)

    with pytest.raises(RateLimited) as limited:
        read_table(connector, "users")
    assert limited.value.retry_after is not None and 1150 < limited.value.retry_after <= 1200


def test_retried_statuses_are_retried_and_the_others_are_not(respx_mock: Any) -> None:
    route = respx_mock.get(f"{API}/users").mock(
        side_effect=[httpx.Response(520), httpx.Response(200, json=[{"id": 1}])]
    )
    connector, _ = open_connector(RULES)
    assert rows(read_table(connector, "users")) == [{"id": 1}]
    assert route.call_count == 2

    respx_mock.get(f"{API}/users").respond(500)
    connector, _ = open_connector(RULES)
    with pytest.raises(PermanentError):
        read_table(connector, "users")

    respx_mock.get(f"{API}/users").respond(502)
    connector, _ = open_connector(RULES)
    with pytest.raises(RetryableError):
        read_table(connector, "users")


def test_an_unchanged_listing_costs_a_304(respx_mock: Any) -> None:
    etag = '"v1"'
    route = respx_mock.get(f"{API}/users").mock(
        side_effect=lambda request: (
            httpx.Response(304, headers={"ETag": etag})
            if request.headers.get("if-none-match") == etag
            else httpx.Response(200, json=[{"id": 1}], headers={"ETag": etag})
        )
    )
    text = RULES.replace("tables:", "conditional: true\ntables:")
    connector, context = open_connector(text)
    assert rows(read_table(connector, "users")) == [{"id": 1}]
    again, _ = open_connector(text, cache=context.cache)

    assert rows(read_table(again, "users")) == [{"id": 1}]
    assert [c.response.status_code for c in route.calls] == [200, 304]


def test_a_next_link_to_another_host_is_refused(respx_mock: Any) -> None:
    respx_mock.get(f"{API}/users").respond(
        json=[{"id": 1}],
        headers={"Link": '<https://collector.evil.example/users?page=2>; rel="next"'},
    )
    elsewhere = respx_mock.get(url__startswith="https://collector.evil.example")
    connector, _ = open_connector(RULES)

    with pytest.raises(PermanentError, match="is not the host of base_url"):
        read_table(connector, "users")
    assert not elsewhere.called


@pytest.mark.parametrize(
    "value", ["//collector.evil.example/x", "https://collector.evil.example/x"]
)
def test_a_config_value_cannot_make_a_path_leave_the_host(value: str, respx_mock: Any) -> None:
    route = respx_mock.get(url__startswith=API).respond(json=[])
    elsewhere = respx_mock.get(url__startswith="https://collector.evil.example")
    connector, _ = open_connector(RULES, config={"path": value})

    read_table(connector, "users")
    assert not elsewhere.called
    (call,) = route.calls  # the value stayed one segment of a path on the API's host
    assert call.request.url.host == "api.tiny.example"
    assert call.request.url.raw_path.count(b"/") == 1


def test_a_redirect_to_another_host_is_refused(respx_mock: Any) -> None:
    respx_mock.get(f"{API}/users").respond(
        302, headers={"Location": "https://collector.evil.example/users"}
    )
    elsewhere = respx_mock.get(url__startswith="https://collector.evil.example")
    connector, _ = open_connector(RULES.replace("paginator: {type: link_header}\n", ""))

    with pytest.raises(PermanentError, match="redirect: refused"):
        read_table(connector, "users")
    assert not elsewhere.called
