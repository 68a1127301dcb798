"""GitHub through the engine as its data changes: a deletion found by the next sync, an operator's
opt-in to read only what changed between complete listings, a listing that shifts while it is
read, pull requests whose embedded repository changes, a resync with nothing new (only 304s),
a repository that answers 404, and one removed from the config. Against a stateful fake that
answers as GitHub's REST docs say (tests/connectors/github_fake.py)."""

from __future__ import annotations

from typing import Any

import respx

from sync import Engine
from sync.base.settings import Settings
from sync.overview import describe_progress
from sync.testing import run_sync
from tests.connectors.github_fake import GitHub, make_issue, make_pull
from tests.connectors.helpers import live_ids, tombstoned_ids

TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"


def connect(engine: Engine, *repos: str) -> int:
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id,
        "gh",
        "github",
        config={"owner": "octocat", "repos": list(repos)},
        credentials={"token": TOKEN},
    )
    return conn.id


def counts(result: dict[str, Any]) -> tuple[str, int, int, int]:
    return result["status"], result["upserted"], result["unchanged"], result["tombstoned"]


def test_a_deletion_upstream_is_tombstoned_by_the_next_sync(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    repo = github.repo("Hello-World")
    repo.issues = [make_issue("Hello-World", n) for n in range(1, 151)]
    conn_id = connect(sync_engine, "Hello-World")

    # While page 2 is asked for, the total is rel="last"'s two pages of 100: an estimate, and
    # said to be one. Once the listing is read, it is the 150 issues read.
    sync_engine.settings.batch_size = 50
    seen: list[str] = []

    def watch(repo_name: str, kind: str, page: int) -> None:
        if kind == "issues" and page == 2:
            (running,) = [r for r in sync_engine.runs() if r.status == "running"]
            seen.append(describe_progress(running.progress))

    github.on_page = watch
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert len(seen) == 1 and seen[0].endswith(" of about 200 records"), seen
    assert counts(run.results["issues"]) == ("succeeded", 150, 0, 0)
    assert run.results["issues"]["partitions"]["Hello-World"]["upserted"] == 150
    assert run.results["issues"]["total"] == 150
    assert "total_estimated" not in run.results["issues"]
    github.on_page = None

    # Upstream: #7 edited, #151 opened, #9 deleted. The next sync lists the repository whole,
    # misses #9, has GitHub confirm it is gone, and tombstones it.
    repo.issues[6]["updated_at"] = "2099-01-01T00:00:00Z"
    repo.issues[6]["title"] = "Edited"
    repo.issues.append(make_issue("Hello-World", 151, updated_at="2099-01-01T00:00:01Z"))
    del repo.issues[8]
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert counts(run.results["issues"]) == ("succeeded", 2, 148, 1)
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {"10000009"}
    assert issue_reads(github, "Hello-World") == ["whole"]
    assert ("/repos/octocat/Hello-World/issues/9", 404) in github.requests


def test_an_operator_may_read_only_what_changed_between_complete_listings(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    repo = github.repo("Hello-World")
    repo.issues = [make_issue("Hello-World", n) for n in range(1, 4)]
    conn_id = connect(sync_engine, "Hello-World")
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    def last_pass_hours_ago(hours: int) -> None:
        with sync_engine.pool.connection() as conn:
            conn.execute(
                "UPDATE table_state SET last_full_sync_at = now() - make_interval(hours => %s), "
                "complete_passes = NULL WHERE connection_id = %s AND table_name = 'issues'",
                (hours, conn_id),
            )

    # By default every sync lists the repository whole, however recent the last listing.
    github.requests.clear()
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    assert issue_reads(github, "Hello-World") == ["whole"]

    # CONNECTOR_SYNC_COMPLETE_EVERY="github.issues=12h": what changed since, until the last
    # complete listing is 12 hours old; a deletion meanwhile waits for that listing.
    sync_engine.settings.complete_every = Settings(
        complete_every="github.issues=12h"
    ).complete_every
    deleted = str(repo.issues.pop(0)["id"])
    last_pass_hours_ago(11)
    github.requests.clear()
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    assert issue_reads(github, "Hello-World") == ["since"]
    assert deleted in live_ids(sync_engine, conn_id, "issues")
    last_pass_hours_ago(13)
    github.requests.clear()
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    assert issue_reads(github, "Hello-World") == ["whole"]
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {deleted}
    # ...and, just done, it is not due again.
    github.requests.clear()
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    assert issue_reads(github, "Hello-World") == ["since"]


def test_a_deletion_while_page_1_is_read_never_tombstones_a_live_issue(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    repo = github.repo("Hello-World")
    repo.issues = [make_issue("Hello-World", n) for n in range(1, 151)]
    conn_id = connect(sync_engine, "Hello-World")
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    # The next sync: issue #50 is deleted after page 1 was served, so #101, first on page
    # 2 until then, moves onto page 1 and is never listed.
    def delete_50(repo_name: str, kind: str, page: int) -> None:
        if kind == "issues" and page == 2 and repo.issues[49]["number"] == 50:
            del repo.issues[49]

    github.on_page = delete_50
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error

    # #101 was missing from the listing, but GitHub says it is there: it stays live. (#50 was
    # on page 1 when page 1 was read.)
    assert tombstoned_ids(sync_engine, conn_id, "issues") == set()
    assert "10000101" in live_ids(sync_engine, conn_id, "issues")
    assert ("/repos/octocat/Hello-World/issues/101", 200) in github.requests

    # The next sync misses #50, and GitHub confirms it is gone.
    github.on_page = None
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.results["issues"]["tombstoned"] == 1
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {"10000050"}
    assert len(live_ids(sync_engine, conn_id, "issues")) == 149
    assert ("/repos/octocat/Hello-World/issues/50", 404) in github.requests


def test_a_transferred_issue_is_gone_from_its_old_repository(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    repo = github.repo("Hello-World")
    repo.issues = [make_issue("Hello-World", n) for n in range(1, 4)]
    conn_id = connect(sync_engine, "Hello-World")
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    repo.issues.pop(1)
    repo.transferred[2] = "https://api.github.com/repositories/42/issues/17"
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {"10000002"}
    # The 301 was read, not followed.
    assert ("/repos/octocat/Hello-World/issues/2", 301) in github.requests
    assert not any("/repositories/42" in q for q, _ in github.requests)


def test_a_new_issue_rewrites_no_pull_request(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    repo = github.repo("Hello-World")
    repo.issues = [make_issue("Hello-World", 1)]
    repo.pulls = [make_pull("Hello-World", n, open_issues=3) for n in (2, 3)]
    conn_id = connect(sync_engine, "Hello-World")
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    before = {r.external_id: r.updated_at for r in sync_engine.records(conn_id, "pull_requests")}

    # One issue opened: every pull request's embedded repository now says so.
    repo.issues.append(make_issue("Hello-World", 4, updated_at="2099-01-01T00:00:00Z"))
    for pull in repo.pulls:
        for side in ("head", "base"):
            pull[side]["repo"].update(
                open_issues_count=4,
                pushed_at="2099-01-01T00:00:00Z",
                updated_at="2099-01-01T00:00:00Z",
            )
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert counts(run.results["pull_requests"]) == ("succeeded", 0, 2, 0)
    after = {r.external_id: r.updated_at for r in sync_engine.records(conn_id, "pull_requests")}
    assert after == before  # 0 rows rewritten

    # A change that matters is still a change.
    repo.pulls[0]["title"] = "Renamed"
    run = run_sync(sync_engine, conn_id)
    assert counts(run.results["pull_requests"]) == ("succeeded", 1, 1, 0)


def test_a_resync_with_nothing_changed_asks_once_per_table_and_repository_or_gets_304s(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    for name in ("Hello-World", "Spoon-Knife"):
        repo = github.repo(name)
        repo.issues = [make_issue(name, n) for n in range(1, 121)]
        repo.pulls = [make_pull(name, n) for n in range(200, 330)]
    conn_id = connect(sync_engine, "Hello-World", "Spoon-Knife")
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    cached = cache_entries(sync_engine, conn_id)
    # The complete listings' pages, per repository: 3 of issues (which lists pull requests
    # too), 2 of pull requests.
    assert cached == 10

    github.requests.clear()
    spent_before = github.remaining
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    # Every page of both complete listings is asked for again, and every one answers 304,
    # which spends none of the rate limit.
    assert cache_entries(sync_engine, conn_id) == cached
    issues = [(q, s) for q, s in github.requests if "/issues" in q]
    pulls = [(q, s) for q, s in github.requests if "/pulls" in q]
    assert len(issues) == 6 and all(s == 304 for _, s in issues)  # three pages each
    assert len(pulls) == 4 and all(s == 304 for _, s in pulls)  # two pages each
    assert github.remaining == spent_before
    assert counts(run.results["issues"]) == ("succeeded", 0, 240, 0)
    assert counts(run.results["pull_requests"]) == ("succeeded", 0, 260, 0)


def cache_entries(engine: Engine, connection_id: int) -> int:
    with engine.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM http_cache WHERE connection_id = %s", (connection_id,)
        ).fetchone()
    assert row is not None
    return int(row["n"])


def test_one_repository_answering_404_fails_only_its_slice(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    hello, gone = github.repo("Hello-World"), github.repo("Gone")
    hello.pulls = [make_pull("Hello-World", n) for n in (1, 2, 3)]
    gone.pulls = [make_pull("Gone", n) for n in (10, 11)]
    gone_ids = {str(p["id"]) for p in gone.pulls}
    conn_id = connect(sync_engine, "Hello-World", "Gone")
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    # The token loses access to one repository; in the other a pull request is deleted.
    gone.visible = False
    del hello.pulls[1]
    run = run_sync(sync_engine, conn_id)
    assert run.status == "partial"
    pulls = run.results["pull_requests"]
    assert pulls["status"] == "partial"
    assert "Gone" in pulls["error"]["message"] and "404" in pulls["error"]["message"]
    assert pulls["partitions"]["Gone"]["status"] == "failed"
    assert counts(pulls["partitions"]["Hello-World"]) == ("succeeded", 0, 2, 1)
    # The readable repository is synced and tombstoned; the other's rows are left as they were.
    assert tombstoned_ids(sync_engine, conn_id, "pull_requests") == {"20000002"}
    assert gone_ids <= live_ids(sync_engine, conn_id, "pull_requests")

    # A second sync still gets 404: the repository is gone, and so are its rows.
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert counts(run.results["pull_requests"]["partitions"]["Gone"]) == ("succeeded", 0, 0, 2)
    assert tombstoned_ids(sync_engine, conn_id, "pull_requests") == {"20000002", *gone_ids}

    # Access comes back: the repository is read whole again, its rows live again.
    gone.visible = True
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert gone_ids <= live_ids(sync_engine, conn_id, "pull_requests")


def test_a_repository_removed_from_the_config_has_its_rows_tombstoned(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    for name in ("Hello-World", "Spoon-Knife"):
        repo = github.repo(name)
        repo.issues = [make_issue(name, n) for n in (1, 2)]
        repo.pulls = [make_pull(name, n) for n in (3, 4)]
    conn_id = connect(sync_engine, "Hello-World", "Spoon-Knife")
    assert run_sync(sync_engine, conn_id).status == "succeeded"
    spoon = {
        table: {str(i["id"]) for i in items}
        for table, items in (
            ("issues", github.repo("Spoon-Knife").issues),
            ("pull_requests", github.repo("Spoon-Knife").pulls),
        )
    }

    sync_engine.update_connection(conn_id, config={"owner": "octocat", "repos": ["Hello-World"]})
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    for table, ids in spoon.items():
        assert tombstoned_ids(sync_engine, conn_id, table) == ids
        assert counts(run.results[table]["partitions"]["Spoon-Knife"]) == ("succeeded", 0, 0, 2)
    # The repository still exists on GitHub: nothing was asked of it.
    assert not any("Spoon-Knife" in q for q, _ in github.requests)

    # Put back in the config, it is read whole: its rows are live again.
    sync_engine.update_connection(
        conn_id, config={"owner": "octocat", "repos": ["Hello-World", "Spoon-Knife"]}
    )
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert issue_reads(github, "Spoon-Knife") == ["whole"]
    for table, ids in spoon.items():
        assert ids <= live_ids(sync_engine, conn_id, table)


def issue_reads(github: GitHub, repo: str) -> list[str]:
    """How the listings of one repository's issues were asked for: "since" (what changed) or
    "whole" (a complete listing), one entry per request of the listing's first page."""
    path = f"/repos/octocat/{repo}/issues?"
    return ["since" if "since=" in q else "whole" for q, _ in github.requests if q.startswith(path)]


def test_a_repository_that_keeps_failing_holds_back_no_other_repositorys_incremental_reads(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    hello, other = github.repo("Hello-World"), github.repo("Other")
    hello.issues = [make_issue("Hello-World", n) for n in range(1, 151)]
    other.issues = [make_issue("Other", n) for n in range(1, 4)]
    sync_engine.settings.complete_every = Settings(complete_every="github.issues=1d").complete_every
    conn_id = connect(sync_engine, "Hello-World", "Other")
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    # The token loses its permission on Other (403), and the daily complete pass is due:
    # Hello-World is read whole, Other fails.
    other.forbidden = True
    with sync_engine.pool.connection() as conn:
        conn.execute(
            "UPDATE table_state SET last_full_sync_at = now() - interval '2 days', "
            "complete_passes = NULL WHERE connection_id = %s AND table_name = 'issues'",
            (conn_id,),
        )
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.results["issues"]["status"] == "partial"
    assert issue_reads(github, "Hello-World") == ["whole"]
    assert issue_reads(github, "Other") == ["whole"]

    # Hello-World's complete pass is done: it goes back to what changed since, while Other,
    # whose pass never happened, is asked for whole again (and fails alone).
    for _ in range(2):
        github.requests.clear()
        run = run_sync(sync_engine, conn_id)
        assert run.results["issues"]["status"] == "partial"
        assert issue_reads(github, "Hello-World") == ["since"]
        assert issue_reads(github, "Other") == ["whole"]

    # Other comes back, with #2 deleted meanwhile: it is read whole, and #2 is confirmed gone
    # and tombstoned; Hello-World still reads only what changed.
    other.forbidden = False
    deleted = str(other.issues.pop(1)["id"])
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert issue_reads(github, "Hello-World") == ["since"]
    assert issue_reads(github, "Other") == ["whole"]
    assert ("/repos/octocat/Other/issues/2", 404) in github.requests
    assert tombstoned_ids(sync_engine, conn_id, "issues") == {deleted}
    assert run.results["issues"]["partitions"]["Other"]["tombstoned"] == 1

    # Its complete pass done, Other too reads only what changed.
    github.requests.clear()
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    assert issue_reads(github, "Hello-World") == issue_reads(github, "Other") == ["since"]


def test_an_operators_retry_reads_the_partitions_that_had_failed(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    github = GitHub(respx_mock)
    gone, flaky = github.repo("Gone"), github.repo("Flaky")
    gone.pulls, flaky.pulls = [make_pull("Gone", 1)], [make_pull("Flaky", 2)]
    gone.visible, flaky.failing = False, True
    conn_id = connect(sync_engine, "Gone", "Flaky")
    run = run_sync(sync_engine, conn_id)
    assert run.status == "failed" and run.attempts == 3  # Flaky never recovered
    assert run.results["pull_requests"]["partitions"]["Gone"]["status"] == "failed"

    # Access granted, GitHub recovered: the operator's retry reads both again.
    gone.visible, flaky.failing = True, False
    sync_engine.retry_run(run.id)
    run = run_sync(sync_engine, conn_id)
    assert run.status == "succeeded", run.error
    parts = run.results["pull_requests"]["partitions"]
    assert {name: p["status"] for name, p in parts.items()} == {
        "Gone": "succeeded",
        "Flaky": "succeeded",
    }
    assert live_ids(sync_engine, conn_id, "pull_requests") == {
        str(gone.pulls[0]["id"]),
        str(flaky.pulls[0]["id"]),
    }
