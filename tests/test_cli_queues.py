"""``connector-sync queues`` and ``jobs``: queues created, changed and deleted, jobs sent, read,
cancelled, retried and redriven, all through the Python API; mistakes are one line and exit 2;
tables fit 80 columns."""

from __future__ import annotations

import json

import pytest

from sync.queues import JobStatus
from tests.cli_backends import Backend, Cli

pytestmark = pytest.mark.parametrize("backend", ["database_url"], indirect=True)


def test_queues_and_jobs_from_the_command_line(cli: Cli, backend: Backend) -> None:
    cli("queues", "create", "docs.dead", "--retention", "30d").ok()
    made = cli(
        "queues",
        "create",
        "docs.ingest",
        "--retry-limit",
        "0",
        "--retry-delay",
        "10s",
        "--retry-ceiling",
        "1m",
        "--expire",
        "5m",
        "--dead-letter",
        "docs.dead",
        "--json",
    ).json()
    assert made == {
        "name": "docs.ingest",
        "policy": "standard",
        "retry_limit": 0,
        "retry_delay": 10.0,
        "retry_ceiling": 60.0,
        "expire": 300.0,
        "dead_letter": "docs.dead",
        "retention": 604800.0,
        "priority": 0,
        "priority_step": 60.0,
        "global_concurrency": None,
        "rate_limit": None,
        "rate_period": None,
    }
    cli("queues", "create", "docs.sync", "--policy", "exclusive").ok()
    cli("queues", "create", "docs.sync").one_line_error("already exists", "queues update")
    cli("queues", "create", "docs.x", "--policy", "fifo").one_line_error("--policy")
    cli("queues", "create", "Bad Name").one_line_error("queue 'Bad Name'")
    cli("queues", "create", "docs.y", "--dead-letter", "nowhere").one_line_error("declare it")
    assert (
        cli("queues", "update", "docs.ingest", "--retry-limit", "1", "--json").json()["retry_limit"]
        == 1
    )

    sent = cli("jobs", "send", "docs.ingest", "--payload", '{"doc": "a.pdf"}', "--json").json()
    assert (sent["status"], sent["payload"]) == ("queued", {"doc": "a.pdf"})
    keyed = cli("jobs", "send", "docs.sync", "--key", "s1", "--json").json()["id"]
    assert cli("jobs", "send", "docs.sync", "--key", "s1", "--json").json()["id"] == keyed
    cli("jobs", "send", "docs.ingest", "--payload", "{bad").one_line_error("--payload")
    cli("jobs", "send", "docs.ingest", "--key", "k").one_line_error("exclusive")
    cli("jobs", "send", "nowhere").one_line_error("no queue named 'nowhere'")

    table = cli("queues", columns=80).ok().out
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert "docs.ingest" in table and "exclusive" in table
    figures = {q["name"]: q for q in cli("queues", "--json").json()}
    assert figures["docs.ingest"]["queued"] == 1 and figures["docs.sync"]["queued"] == 1
    assert figures["docs.ingest"]["lanes_online"] == 0
    assert figures["docs.ingest"]["oldest_queued_seconds"] >= 0

    listed = cli("jobs", "list", "--queue", "docs.sync", "--json").json()
    assert [j["id"] for j in listed] == [keyed]
    listing = cli("jobs", "list", columns=80).ok().out
    assert all(len(line) <= 80 for line in listing.splitlines()), listing
    cli("jobs", "list", "--status", "nope").one_line_error("--status")

    # A handler that fails: dead in docs.dead after its two attempts, then redriven.
    with backend.engine() as engine:
        engine.queues.register("docs.ingest", lambda job, abort: 1 / 0)
        assert engine.queues.run_due() == 1
        engine.queues.retry_job(sent["id"])  # the retry is due now
        assert engine.queues.run_due() == 1
        assert engine.queues.get_job(sent["id"]).status is JobStatus.DEAD
    shown = cli("jobs", "show", str(sent["id"]), "--json").json()
    assert (shown["queue"], shown["status"]) == ("docs.dead", "dead")
    assert [a["outcome"] for a in shown["attempt_history"]] == ["failed", "failed"]
    text = cli("jobs", "show", str(sent["id"]), columns=80).ok().out
    assert "ZeroDivisionError" in text and all(len(line) <= 80 for line in text.splitlines())
    # Redriving the queue it was sent to finds nothing there, and says where to look.
    nothing = cli("jobs", "redrive", "docs.ingest").ok().out
    assert " ".join(nothing.split()) == (
        "redrove 0 job(s) from docs.ingest docs.ingest's dead jobs move to its dead-letter "
        "queue docs.dead, which holds 1: `connector-sync jobs redrive docs.dead` sends them "
        "back to docs.ingest"
    )
    assert cli("jobs", "redrive", "docs.dead", "--json").json() == {
        "redriven": [sent["id"]],
        "skipped": [],
    }
    cli("jobs", "cancel", str(sent["id"])).ok()
    cli("jobs", "cancel", str(sent["id"])).one_line_error("cancelled")
    assert cli("jobs", "retry", str(sent["id"]), "--json").json()["status"] == "queued"
    cli("jobs", "show", "999999").one_line_error("no job 999999")

    cli("queues", "delete", "docs.dead").one_line_error("dead-letter queue of docs.ingest")
    cli("queues", "delete", "docs.sync").one_line_error("1 queued")
    cli("jobs", "cancel", str(keyed)).ok()
    cli("queues", "delete", "docs.sync").ok()
    assert "docs.sync" not in {q["name"] for q in cli("queues", "--json").json()}


@pytest.mark.slow
def test_twenty_concurrent_sends_of_one_key_from_the_command_line_report_one_job(
    cli: Cli, backend: Backend
) -> None:
    cli("queues", "create", "sources.sync", "--policy", "exclusive").ok()
    senders = [
        cli.script("jobs", "send", "sources.sync", "--key", "source-7", "--json") for _ in range(20)
    ]
    ids = []
    for sender in senders:
        out, err = sender.communicate(timeout=120)
        assert sender.returncode == 0, err
        ids.append(json.loads(out)["id"])
    assert len(set(ids)) == 1, ids
    assert [j["id"] for j in cli("jobs", "list", "--queue", "sources.sync", "--json").json()] == [
        ids[0]
    ]


def test_priorities_start_times_and_fleet_wide_limits_from_the_command_line(
    cli: Cli, backend: Backend
) -> None:
    made = cli(
        "queues", "create", "partner.api", "--global-concurrency", "3", "--rate", "100/1m",
        "--priority", "5", "--json",
    ).json()  # fmt: skip
    assert (made["global_concurrency"], made["rate_limit"], made["rate_period"]) == (3, 100, 60)
    assert made["priority"] == 5
    listed = {q["name"]: q for q in cli("queues", "--json").json()}["partner.api"]
    assert (listed["global_concurrency"], listed["rate_limit"], listed["rate_period"]) == (
        3,
        100,
        60,
    )
    table = cli("queues", columns=80).ok().out
    assert "max 3, 100/1m" in table, table
    assert all(len(line) <= 80 for line in table.splitlines()), table

    urgent = cli("jobs", "send", "partner.api", "--priority", "0", "--json").json()
    default = cli("jobs", "send", "partner.api", "--json").json()
    assert (urgent["priority"], default["priority"]) == (0, 5)
    later = cli("jobs", "send", "partner.api", "--delay", "30s", "--json").json()
    assert later["run_after"] > later["created_at"]
    at = cli("jobs", "send", "partner.api", "--at", "2030-12-24T08:00Z", "--json").json()
    assert at["run_after"].startswith("2030-12-24T08:00:00")
    shown = cli("jobs", "send", "partner.api", "--delay", "5m").ok().out
    assert "priority 5" in shown and "due" in shown

    cli("jobs", "send", "partner.api", "--priority", "10").one_line_error("priority", "0", "9")
    cli("jobs", "send", "partner.api", "--at", "2030-12-24T08:00").one_line_error("time zone")
    cli("jobs", "send", "partner.api", "--at", "tomorrow").one_line_error("--at")
    cli("jobs", "send", "partner.api", "--at", "2030-12-24T08:00Z", "--delay", "1m").one_line_error(
        "not both"
    )
    cli("queues", "update", "partner.api", "--rate", "100").one_line_error("--rate", "10/s")
    lifted = cli(
        "queues", "update", "partner.api", "--rate", "none", "--global-concurrency", "0", "--json"
    ).json()
    assert (lifted["global_concurrency"], lifted["rate_limit"], lifted["priority"]) == (
        None,
        None,
        5,
    )
