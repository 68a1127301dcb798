"""What only the Postgres implementation of the application queues can show: senders in
processes of their own racing for one singleton key, the claim reading its partial indexes
however many finished jobs retention keeps, and every statement preparing."""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import pytest

from sync import Engine, Settings
from sync.queues import JobStatus, QueuePolicy, queue_spec
from sync.queues.postgres import PostgresQueues
from sync.store.queries import parse
from sync.store.sqlfiles import sql_dir
from tests.plans import explained, nodes
from tests.test_queries import _PLACEHOLDER

SENDERS = 20


def _send(settings: Settings, barrier: Any, results: Any) -> None:
    with Engine(settings, pool_size=3) as engine:
        barrier.wait(60)
        results.put(engine.queues.send("sources.sync", {"source": 7}, key="source-7"))


@pytest.mark.slow
def test_twenty_sender_processes_of_one_key_make_one_job_and_all_get_its_id(
    engine: Engine,
) -> None:
    engine.queues.declare_queue(queue_spec("sources.sync", policy=QueuePolicy.EXCLUSIVE))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(SENDERS)
    results = context.Queue()
    processes = [
        context.Process(target=_send, args=(engine.settings, barrier, results))
        for _ in range(SENDERS)
    ]
    for process in processes:
        process.start()
    ids = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert len(set(ids)) == 1, ids
    assert [job.id for job in engine.queues.list_jobs(queue="sources.sync")] == [ids[0]]


QUEUES = """
INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire, retention)
VALUES ('docs.ingest', 'standard', 2, 5, 300, 900, 604800),
       ('docs.other', 'standard', 2, 5, 300, 900, 604800);
"""
HISTORY = (
    QUEUES
    + """
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at, finished_at,
                  attempts)
SELECT 'docs.ingest', 'docs.ingest', '{}', (ARRAY['completed', 'dead', 'cancelled'])[1 + g % 3],
       now() - interval '1 day', now() - interval '1 day', now(), 1
  FROM generate_series(1, 100000) g;
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at)
SELECT 'docs.other', 'docs.other', '{}', 'queued', now() - interval '1 hour', now()
  FROM generate_series(1, 20000) g;
"""
)
# A backlog sent a moment ago, before any statistics know of it.
BACKLOG = """
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at)
SELECT 'docs.ingest', 'docs.ingest', '{}', 'queued', now() - g * interval '1 ms', now()
  FROM generate_series(1, 20000) g;
"""


def test_the_claim_reads_its_partial_indexes_with_100k_finished_jobs(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    admin.execute("ANALYZE job_queues, jobs")
    admin.execute(BACKLOG)
    row, plans = explained(
        admin, "SELECT id FROM claim_jobs_v2(ARRAY['docs.ingest'], 10, 60, NULL)"
    )
    assert row is not None
    locking = [p for p in plans if "SKIP LOCKED" in p["Query Text"]]
    assert len(locking) == 2, [p["Query Text"] for p in plans]
    for plan in locking:
        scans = [n for n in nodes(plan["Plan"]) if n.get("Relation Name") == "jobs"]
        assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), json.dumps(plan)
        assert {n["Index Name"] for n in scans} <= {"jobs_due", "jobs_expiring"}, json.dumps(plan)
        # Neither the finished history, nor the other queue's backlog, nor this queue's backlog
        # past the limit is read.
        assert sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans) <= 10
        # The generic plan, from the first call on: its conditions name the parameters ($n)
        # where a plan made for one call's values would show the values.
        conditions = " ".join(n.get("Index Cond", "") for n in scans)
        assert "$" in conditions and "docs.ingest" not in conditions, conditions


def test_every_statement_of_the_queues_prepares(engine: Engine, admin: Any) -> None:
    """PREPARE checks every name and type in a statement of sql/queues.sql without running
    it, also the statements no other test reaches."""
    for name, query in parse((sql_dir() / "queues.sql").read_text()).items():
        params = sorted(set(_PLACEHOLDER.findall(query.text)))
        numbered = _PLACEHOLDER.sub(lambda m, p=params: f"${p.index(m.group(1)) + 1}", query.text)
        admin.execute(f"PREPARE check_{name} AS {numbered}")
        admin.execute(f"DEALLOCATE check_{name}")


def test_the_claim_is_one_update_unless_an_attempt_has_expired(engine: Engine, admin: Any) -> None:
    """claim_jobs_v3 claims with one UPDATE over jobs_due while no attempt of the queue is past
    its expiry, reading neither the finished history nor the backlog past its limit; with an
    expired attempt it is claim_jobs_v2, which takes the attempt back before anything else."""
    admin.execute(HISTORY)
    admin.execute("ANALYZE job_queues, jobs")
    admin.execute(BACKLOG)
    claim = "SELECT id, attempts FROM claim_jobs_v3(ARRAY['docs.ingest'], 10, 60, NULL)"
    row, plans = explained(admin, claim)
    assert row is not None
    texts = [p["Query Text"] for p in plans]
    assert not any("claim_jobs_v2" in t for t in texts), texts
    locking = [p for p in plans if "SKIP LOCKED" in p["Query Text"]]
    assert len(locking) == 1, texts
    for plan in plans:
        scans = [
            n
            for n in nodes(plan["Plan"])
            if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"
        ]
        indexes = {n.get("Index Name", n["Node Type"]) for n in scans}
        assert indexes <= {"jobs_due", "jobs_expiring", "jobs_pkey"}, json.dumps(plan)
        # Neither the finished history, nor the other queue's backlog, nor this queue's backlog
        # past the limit is read; the started jobs are found again by their key.
        read = sum(
            n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
            for n in scans
            if n.get("Index Name") != "jobs_pkey"
        )
        assert read <= 10, json.dumps(plan)

    expired = admin.execute(
        "UPDATE jobs SET status = 'active', attempts = 1, started_at = now() - interval '2 hours',"
        " expires_at = now() - interval '1 hour', lease_owner = gen_random_uuid()"
        " WHERE id = (SELECT min(id) FROM jobs WHERE origin_queue = 'docs.ingest'"
        " AND status = 'queued') RETURNING id"
    ).fetchone()["id"]
    row, plans = explained(admin, claim.replace("10,", "1,"))
    assert (row["id"], row["attempts"]) == (expired, 2)  # taken back and run again first
    assert any("claim_jobs_v2" in p["Query Text"] for p in plans)


def test_a_claimed_job_is_the_job_as_stored_field_by_field(engine: Engine) -> None:
    """The claim's rows are read by position: each field of a claimed job is the stored one."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.embed", retry_limit=4, expire=90))
    queues.register("docs.embed", lambda job, abort: None)
    sent = queues.send("docs.embed", {"doc": 7, "tags": ["a"]}, priority=3)
    (claimed,) = queues.claim(["docs.embed"], 1)
    assert claimed.job == queues.get_job(sent)
    assert claimed.job.status is JobStatus.ACTIVE and claimed.job.priority == 3
    assert (claimed.spec.retry_limit, claimed.spec.expire) == (4, 90)
