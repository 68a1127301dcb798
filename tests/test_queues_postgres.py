"""What only the Postgres implementation of the application queues can show: senders in
processes of their own racing for one singleton key, the claim reading its partial indexes
however many finished jobs retention keeps, and every statement preparing."""

from __future__ import annotations

import json
import multiprocessing
import re
import uuid
from typing import Any

import pytest

from sync import Engine, Settings
from sync.queries import parse
from sync.queues import JobStatus, QueuePolicy, queue_spec
from sync.sqlfiles import sql_dir
from tests.plans import explained, nodes

SENDERS = 20
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


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


HISTORY = """
INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire, retention)
VALUES ('docs.ingest', 'standard', 2, 5, 300, 900, 604800),
       ('docs.other', 'standard', 2, 5, 300, 900, 604800);
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at, finished_at,
                  attempts)
SELECT 'docs.ingest', 'docs.ingest', '{}', (ARRAY['completed', 'dead', 'cancelled'])[1 + g % 3],
       now() - interval '1 day', now() - interval '1 day', now(), 1
  FROM generate_series(1, 100000) g;
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at)
SELECT 'docs.other', 'docs.other', '{}', 'queued', now() - interval '1 hour', now()
  FROM generate_series(1, 20000) g;
"""
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


def test_a_claim_that_completes_attempts_commits_durably_and_completes_them_fenced(
    engine: Engine, admin: Any
) -> None:
    """claim_jobs_v3 completes the attempts a lane ran, fenced by their tokens, then claims.
    A claim alone may commit without waiting for its WAL flush; one that completed something
    must not: a completion lost in a crash would run its job twice."""
    queues = engine.queues
    queues.declare_queue(queue_spec("docs.ingest"))
    queues.register("docs.ingest", lambda job, abort: None)
    first, second, third, fourth = (queues.send("docs.ingest", {"n": n}) for n in range(4))
    held = queues.claim(["docs.ingest"], 2)
    assert [a.job.id for a in held] == [first, second]
    stale = uuid.uuid4()  # a token no attempt holds: its completion matches nothing
    with engine.pool.connection() as conn, conn.transaction():
        claimed = conn.execute(
            "SELECT id FROM claim_jobs_v3(%s, %s, ARRAY['docs.ingest'], 1, 60, NULL)",
            ([first, second], [held[0].lease_owner, stale]),
        ).fetchall()
        durability = conn.execute("SHOW synchronous_commit").fetchone()
    assert [r["id"] for r in claimed] == [third]
    assert durability["synchronous_commit"] == "on"
    assert queues.get_job(first).status is JobStatus.COMPLETED
    assert queues.get_job(second).status is JobStatus.ACTIVE
    assert [a.outcome.value for a in queues.attempts(first)] == ["completed"]

    with engine.pool.connection() as conn, conn.transaction():
        claimed = conn.execute(
            "SELECT id FROM claim_jobs_v3('{}', '{}', ARRAY['docs.ingest'], 1, 60, NULL)"
        ).fetchall()
        alone = conn.execute("SHOW synchronous_commit").fetchone()
    assert [r["id"] for r in claimed] == [fourth]
    assert alone["synchronous_commit"] == "off"  # a claim alone, as claim_jobs_v2 commits it
