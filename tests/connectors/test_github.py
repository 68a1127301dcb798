"""GitHub: issues and pull requests through the real engine and Postgres, against respx mocks
shaped like GitHub's REST docs (Link paging, x-ratelimit-* headers, 403/429 rate limits)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import respx

from connectors.github import GitHubConfig, GitHubConnector, classify_github
from connectors.http_policy import Verdict
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
    tombstoned_ids,
)

BASE = "https://api.github.com"
ISSUES = f"{BASE}/repos/octocat/Hello-World/issues"
PULLS = f"{BASE}/repos/octocat/Hello-World/pulls"
# GitHub's Link header names the repository by id, not by owner/name.
ISSUES_BY_ID = f"{BASE}/repositories/1296269/issues"
PAGE_2 = f"{ISSUES_BY_ID}?state=all&per_page=100&sort=created&direction=asc&page=2"
PAGE_1 = f"{ISSUES_BY_ID}?state=all&per_page=100&sort=created&direction=asc&page=1"
LISTED = {"state": "all", "per_page": "100", "sort": "created", "direction": "asc"}
TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
CONFIG = {"owner": "octocat", "repos": ["Hello-World"]}


def github(
    body: Any,
    status: int = 200,
    *,
    remaining: int = 4987,
    reset: int | None = None,
    link: str | None = None,
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    """A response with the headers GitHub sends on every REST call."""
    headers = {
        "x-github-api-version-selected": "2022-11-28",
        "x-github-media-type": "github.v3; format=json",
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-reset": str(reset or int(time.time()) + 3200),
        "x-ratelimit-used": str(5000 - remaining),
        "x-ratelimit-resource": "core",
        "x-github-request-id": "0400:2A3B:1C9F2E4:1D2B5A7:66390F2B",
        **(extra or {}),
    }
    if link:
        headers["link"] = link
    return json_response(body, status, headers)


def first_page(**kwargs: Any) -> httpx.Response:
    link = f'<{PAGE_2}>; rel="next", <{PAGE_2}>; rel="last"'
    return github(fixture("github", "issues_page1.json"), link=link, **kwargs)


def last_page(items: list[dict[str, Any]] | None = None) -> httpx.Response:
    link = f'<{PAGE_1}>; rel="prev", <{PAGE_1}>; rel="first"'
    return github(items or fixture("github", "issues_page2.json"), link=link)


def connect(engine: Engine, name: str = "gh", token: str = TOKEN, **config: Any) -> int:
    ws = engine.workspaces()[0] if engine.workspaces() else engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, name, "github", config={**CONFIG, **config}, credentials={"token": token}
    )
    return conn.id


def test_first_sync_then_updates_deletions_and_additions(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    issues = respx_mock.get(ISSUES, params=LISTED).mock(return_value=first_page())
    issues_2 = respx_mock.get(ISSUES_BY_ID, params={"page": "2"}).mock(return_value=last_page())
    pulls = respx_mock.get(PULLS, params=LISTED).mock(
        return_value=github(fixture("github", "pulls.json"))
    )
    conn_id = connect(sync_engine)

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {"issues": result(upserted=3), "pull_requests": result(upserted=2)}
    # Pull request #1348 is listed by the issues endpoint too, but belongs to pull_requests.
    assert live_ids(sync_engine, conn_id, "issues") == {"1", "2268350733", "2270881045"}
    assert live_ids(sync_engine, conn_id, "pull_requests") == {"1827561250", "1827561311"}
    request = issues.calls.last.request
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["accept"] == "application/vnd.github+json"
    assert request.headers["x-github-api-version"] == "2022-11-28"
    assert issues_2.calls.last.request.url == PAGE_2

    # Upstream: #1347 closed, #1349 deleted, #1350 untouched, #1352 opened, PR #1348 merged.
    # The next sync lists every issue again: #1349 is missing, GitHub confirms it is gone, and
    # it is tombstoned by this very sync.
    closed = fixture("github", "issues_page1.json")[0]
    closed.update(state="closed", state_reason="completed", closed_at="2024-05-06T10:00:00Z")
    closed["updated_at"] = "2024-05-06T10:00:00Z"
    issues.mock(
        return_value=github(
            [closed, fixture("github", "issues_page1.json")[1]], link=f'<{PAGE_2}>; rel="next"'
        )
    )
    issues_2.mock(
        return_value=last_page(
            [*fixture("github", "issues_page2.json"), fixture("github", "issue_new.json")]
        )
    )
    gone = respx_mock.get(f"{ISSUES}/1349").mock(
        return_value=github({"message": "Not Found", "status": "404"}, 404)
    )
    prs = fixture("github", "pulls.json")
    merged_at = "2024-05-06T10:00:00Z"
    prs[0].update(state="closed", merged_at=merged_at, closed_at=merged_at)
    pulls.mock(return_value=github(prs))

    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert plain(run.results) == {
        "issues": result(upserted=2, unchanged=1, tombstoned=1),
        "pull_requests": result(upserted=1, unchanged=1),
    }
    assert gone.call_count == 1
    assert issues.calls.last.request.url.params.get("since") is None
    assert live_ids(sync_engine, conn_id, "issues") == {"1", "2270881045", "2281004112"}
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {"2268350733"}
    issue = {r.external_id: r.data for r in sync_engine.records(conn_id, "issues")}["1"]
    assert issue["state"] == "closed"
    merged = {r.external_id: r.data for r in sync_engine.records(conn_id, "pull_requests")}
    assert merged["1827561250"]["merged_at"] == "2024-05-06T10:00:00Z"


@pytest.mark.parametrize(
    ("status", "body"),
    [(429, "secondary_rate_limit.json"), (403, "secondary_rate_limit.json")],
    ids=["429", "403-secondary"],
)
def test_a_long_retry_after_requeues_the_run_at_that_time(
    sync_engine: Engine, respx_mock: respx.MockRouter, status: int, body: str
) -> None:
    respx_mock.get(ISSUES).mock(
        return_value=github(fixture("github", body), status, extra={"retry-after": "600"})
    )
    conn_id = connect(sync_engine)
    before = now()
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert (run.attempts, run.waits) == (0, 1)  # a wait spends no attempt
    assert abs(requeued_in(run, after=before) - 600) <= 2
    assert run.results["issues"]["status"] == "retry"
    assert run.results["issues"]["error"]["kind"] == "rate_limited"
    # The budget is spent for every table: pull requests wait for the next attempt.
    assert run.results["pull_requests"]["status"] == "pending"


def test_a_short_retry_after_is_slept_inside_the_run(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    issues = respx_mock.get(ISSUES).mock(
        side_effect=[
            github(fixture("github", "secondary_rate_limit.json"), 429, extra={"retry-after": "1"}),
            github(fixture("github", "issues_page2.json")),
        ]
    )
    respx_mock.get(PULLS).mock(return_value=github([]))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded" and run.attempts == 1
    assert issues.call_count == 2
    assert plain(run.results)["issues"] == result(upserted=1)


def test_a_spent_primary_budget_stops_before_the_next_request_until_the_reset(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    reset = int(time.time()) + 900
    # Page 1 arrives with the last request of the hour; page 2 is not asked for.
    respx_mock.get(ISSUES).mock(return_value=first_page(remaining=0, reset=reset))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert abs(run.queued_at.timestamp() - reset) <= 2
    assert run.results["issues"]["status"] == "retry"
    assert run.results["issues"]["upserted"] == 2  # what was read is kept
    assert live_ids(sync_engine, conn_id, "issues") == {"1", "2268350733"}

    # Another connection on the same token is held back until the reset; one on another token
    # syncs meanwhile.
    other_repo = f"{BASE}/repos/octocat/Spoon-Knife"
    respx_mock.get(f"{other_repo}/issues").mock(return_value=github([]))
    respx_mock.get(f"{other_repo}/pulls").mock(return_value=github([]))
    same_token = connect(sync_engine, "same-token", repos=["Spoon-Knife"])
    other_token = connect(sync_engine, "other-token", token="ghp_other", repos=["Spoon-Knife"])
    held = sync_engine.sync(same_token)
    worker = sync_engine.worker(listen=False)
    assert worker.poll() is False
    assert sync_engine.run(held.id).status == "queued"
    assert run_sync(sync_engine, other_token, worker=worker).status == "succeeded"
    assert sync_engine.run(held.id).attempts == 0


def test_a_403_with_no_budget_left_is_a_rate_limit_until_the_reset(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    reset = int(time.time()) + 1800
    respx_mock.get(ISSUES).mock(
        return_value=github(
            fixture("github", "rate_limit_exceeded.json"), 403, remaining=0, reset=reset
        )
    )
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id, skip_retry_waits=False)
    assert abs(run.queued_at.timestamp() - reset) <= 2
    assert run.results["issues"]["error"]["kind"] == "rate_limited"


def test_refused_credentials_disconnect_the_connection(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    # A personal access token cannot be refreshed: a 401 is final.
    respx_mock.get(ISSUES).mock(return_value=github(fixture("github", "bad_credentials.json"), 401))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "failed"
    assert run.error is not None and run.error.kind == "auth"
    assert TOKEN not in str(run.error) and TOKEN not in str(run.results)
    assert sync_engine.connection(conn_id).status == "disconnected"


def test_an_endless_next_link_ends_the_table_and_keeps_what_was_read(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.get(ISSUES).mock(return_value=first_page())
    # Page 2 says its next page is page 2.
    looping = respx_mock.get(ISSUES_BY_ID, params={"page": "2"}).mock(
        return_value=github(fixture("github", "issues_page2.json"), link=f'<{PAGE_2}>; rel="next"')
    )
    respx_mock.get(PULLS).mock(return_value=github(fixture("github", "pulls.json")))
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "partial"
    assert looping.call_count == 2
    issues = run.results["issues"]
    assert issues["status"] == "failed" and issues["upserted"] == 3
    assert "paging loop" in issues["error"]["message"]
    assert live_ids(sync_engine, conn_id, "issues") == {"1", "2268350733", "2270881045"}
    assert plain(run.results)["pull_requests"] == result(upserted=2)


def test_malformed_json_fails_the_table_after_its_retries_and_loses_nothing(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.get(ISSUES).mock(return_value=github(fixture("github", "issues_page2.json")))
    cut_short = json_response(fixture("github", "pulls.json")).content[:1500]
    pulls = respx_mock.get(PULLS).mock(
        return_value=httpx.Response(
            200, content=cut_short, headers={"Content-Type": "application/json; charset=utf-8"}
        )
    )
    conn_id = connect(sync_engine)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "failed" and run.attempts == 3
    assert pulls.call_count == 3
    assert plain(run.results)["issues"] == result(
        upserted=1
    )  # settled in attempt 1, not read again
    assert run.results["pull_requests"]["status"] == "failed"
    assert "not valid JSON" in run.results["pull_requests"]["error"]["message"]
    assert live_ids(sync_engine, conn_id, "issues") == {"2270881045"}


# -- offline, with FakeContext -------------------------------------------------------------


def test_an_enterprise_host_and_several_repositories(respx_mock: respx.MockRouter) -> None:
    ghes = "https://github.example.com/api/v3"
    first = respx_mock.get(f"{ghes}/repos/octocat/Hello-World/issues").mock(
        return_value=github(fixture("github", "issues_page1.json"))
    )
    second = respx_mock.get(f"{ghes}/repos/octocat/Spoon-Knife/issues").mock(
        return_value=github(fixture("github", "issues_page2.json"))
    )
    config = GitHubConfig(owner="octocat", repos=["Hello-World", "Spoon-Knife"], base_url=ghes)
    connector = GitHubConnector(FakeContext(config=config, credentials={"token": TOKEN}))
    items = read_table(connector, "issues")
    assert [item["number"] for item in items if isinstance(item, dict)] == [1347, 1349, 1350]
    assert first.call_count == second.call_count == 1


def test_the_budget_key_is_a_digest_of_the_token() -> None:
    config = GitHubConfig(**CONFIG)
    key = GitHubConnector.budget_key(config, {"token": TOKEN})
    assert key is not None and TOKEN not in key
    assert key == GitHubConnector.budget_key(config, {"token": TOKEN})
    assert key != GitHubConnector.budget_key(config, {"token": "ghp_another"})


@pytest.mark.parametrize(
    ("status", "headers", "body", "wait"),
    [
        (403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "{in_120s}"}, b"{}", 120),
        (429, {"retry-after": "30", "x-ratelimit-remaining": "0"}, b"{}", 30),
        (403, {"x-ratelimit-remaining": "12"}, b'{"message":"secondary rate limit"}', 60),
        (403, {"x-ratelimit-remaining": "12"}, b'{"message":"Must have admin rights"}', None),
        (404, {}, b'{"message":"Not Found"}', None),
        (200, {"x-ratelimit-remaining": "0"}, b"[]", None),
    ],
    ids=["primary", "retry-after", "secondary", "permission", "404", "ok"],
)
def test_which_github_responses_are_rate_limits(
    status: int, headers: dict[str, str], body: bytes, wait: float | None
) -> None:
    at = now()
    headers = {k: v.format(in_120s=int(at.timestamp()) + 120) for k, v in headers.items()}
    found = classify_github(httpx.Response(status, headers=headers, content=body), at)
    if wait is None:
        assert found is None  # the standard classification applies
    else:
        assert found is not None and found.verdict is Verdict.RATE_LIMITED
        assert found.wait is not None and abs(found.wait - wait) <= 1
