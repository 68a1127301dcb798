"""Plan regression: each retention batch reads through an index or by tuple id, never a scan of
the whole table, so a batch costs its own rows however large the history is."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sync import Engine
from sync.store.maintenance import MAINTENANCE
from sync.store.queries import QUERIES
from tests.plans import explained, nodes

HISTORY = """
INSERT INTO workspaces (name) VALUES ('acme');
INSERT INTO connections (workspace_id, name, provider)
SELECT 1, 'c' || g, 'memory' FROM generate_series(1, 100) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at,
                             finished_at, attempts)
SELECT 1 + g % 100, 1, 'memory', 'succeeded', now() - interval '90 days' + g * interval '1 min',
       now() - interval '90 days' + g * interval '1 min', 1
  FROM generate_series(1, 50000) g;
INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id)
SELECT id, 1, gen_random_uuid(), 'w' FROM connection_runs;
INSERT INTO records (connection_id, table_name, external_id, data, content_hash, written_by,
                     deleted_at)
SELECT 1, 'items', g::text, '{}', '\\x00', gen_random_uuid(),
       CASE WHEN g % 10 = 0 THEN now() - interval '100 days' END
  FROM generate_series(1, 50000) g;
ANALYZE workspaces, connections, connection_runs, run_attempts, records;
"""


def plan_of(admin: Any, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of the statement's plan, and of those its foreign keys' cascades ran."""
    _, plans = explained(admin, MAINTENANCE._by_name[name].text, params)
    return [node for plan in plans for node in nodes(plan["Plan"])]


def scans_of(found: list[dict[str, Any]], relation: str) -> list[dict[str, Any]]:
    return [
        n for n in found if n.get("Relation Name") == relation and n["Node Type"].endswith("Scan")
    ]


def test_a_batch_of_old_runs_walks_the_retention_index(engine: Engine, admin: Any) -> None:
    admin.execute(HISTORY)
    found = plan_of(
        admin,
        "prune_runs_batch",
        {
            "older_than": timedelta(days=30),
            "keep": 20,
            "limit": 1000,
            "after_finished_at": datetime(1, 1, 1, tzinfo=UTC),
            "after_id": 0,
            "delete": True,
        },
    )
    runs = scans_of(found, "connection_runs")
    assert not [n for n in runs if n["Node Type"] == "Seq Scan"], json.dumps(found, indent=1)
    walk = next(n for n in runs if n.get("Index Name") == "connection_runs_retention")
    assert walk["Actual Rows"] == 1000  # the batch, not the 42,000 old runs
    # The newest runs of each connection are counted through its index, 20 at most per run.
    assert any(n.get("Index Name") == "connection_runs_by_connection" for n in found)
    # The attempts are counted, and deleted by the cascade, through their index.
    attempts = scans_of(found, "run_attempts")
    assert {n.get("Index Name") for n in attempts} == {"run_attempts_by_run"}, [
        (n["Node Type"], n.get("Index Name")) for n in attempts
    ]


def test_the_connections_page_reads_each_last_run_by_one_index_probe(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    _, plans = explained(
        admin, QUERIES._by_name["connections_overview"].text, {"workspace_id": 1, "limit": 500}
    )
    found = [node for plan in plans for node in nodes(plan["Plan"])]
    sorts = [key for n in found if n["Node Type"] == "Sort" for key in n["Sort Key"]]
    assert not [k for k in sorts if "finished_at" in k], sorts  # the index gives the order
    last = [n for n in found if n.get("Index Name") == "connection_runs_last_finished"]
    # One row per connection read, not its 500 finished runs.
    assert last and last[0]["Actual Rows"] == 1 and last[0]["Actual Loops"] == 100, last


def test_a_batch_of_old_tombstones_reads_them_by_index_and_deletes_by_tuple_id(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    found = plan_of(
        admin,
        "prune_tombstones_batch",
        {"older_than": timedelta(days=30), "limit": 1000, "delete": True},
    )
    records = scans_of(found, "records")
    assert {n["Node Type"] for n in records} == {"Index Scan", "Tid Scan"}, json.dumps(found)
    candidates = next(n for n in records if n["Node Type"] == "Index Scan")
    assert candidates["Index Name"] == "records_tombstoned"
    assert candidates["Actual Rows"] == 1000  # of 5,000 old tombstones and 45,000 live rows


JOBS_AND_INGESTIONS = """
INSERT INTO workspaces (name) VALUES ('acme');
INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire, retention)
VALUES ('app.a', 'standard', 1, 1, 1, 60, 86400), ('app.b', 'standard', 1, 1, 1, 60, 86400);
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at, finished_at)
SELECT q, q, '{}', CASE WHEN g % 10 = 0 THEN 'queued' ELSE 'completed' END,
       now() - interval '40 days', now() - interval '40 days',
       CASE WHEN g % 10 = 0 THEN NULL ELSE now() - interval '40 days' + g * interval '1 min' END
  FROM generate_series(1, 50000) g, LATERAL (SELECT CASE WHEN g % 2 = 0 THEN 'app.a'
                                                      ELSE 'app.b' END AS q) q;
INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome)
SELECT id, 1, queue, created_at, created_at, 'completed' FROM jobs;
INSERT INTO ingestions (workspace_id, status, source, local_path, source_hash, max_attempts,
                        finished_at)
SELECT 1, CASE WHEN g % 10 = 0 THEN 'queued' ELSE 'ready' END, 'local', '/data/' || g, '\\x00', 3,
       CASE WHEN g % 10 = 0 THEN NULL ELSE now() - interval '90 days' + g * interval '1 min' END
  FROM generate_series(1, 50000) g;
ANALYZE workspaces, job_queues, jobs, job_attempts, ingestions;
"""


def test_a_batch_of_old_jobs_walks_each_queue_by_its_finished_index(
    engine: Engine, admin: Any
) -> None:
    admin.execute(JOBS_AND_INGESTIONS)
    found = plan_of(admin, "prune_jobs_batch", {"limit": 1000, "delete": True})
    jobs = scans_of(found, "jobs")
    assert not [n for n in jobs if n["Node Type"] == "Seq Scan"], json.dumps(found, indent=1)
    walks = [n for n in jobs if n.get("Index Name") == "jobs_finished"]
    assert walks and sum(n["Actual Rows"] for n in walks) <= 2000  # not the 45,000 finished
    attempts = scans_of(found, "job_attempts")
    assert {n.get("Index Name") for n in attempts} == {"job_attempts_by_job"}, [
        (n["Node Type"], n.get("Index Name")) for n in attempts
    ]


def test_a_batch_of_old_ingestions_walks_the_finished_index(engine: Engine, admin: Any) -> None:
    admin.execute(JOBS_AND_INGESTIONS)
    found = plan_of(
        admin,
        "prune_ingestions_batch",
        {"older_than": timedelta(days=30), "limit": 1000, "delete": True},
    )
    ingestions = scans_of(found, "ingestions")
    assert not [n for n in ingestions if n["Node Type"] == "Seq Scan"], json.dumps(found, indent=1)
    walk = next(n for n in ingestions if n.get("Index Name") == "ingestions_finished")
    assert walk["Actual Rows"] == 1000  # the batch, not the 45,000 finished


HTTP_CACHE = """
INSERT INTO workspaces (name) VALUES ('acme');
INSERT INTO connections (workspace_id, name, provider) VALUES (1, 'gh', 'github');
INSERT INTO http_cache (connection_id, url_hash, etag, headers, body, used_at)
SELECT 1, sha256(int4send(g)), 'e', '{}', '',
       CASE WHEN g % 10 = 0 THEN now() - interval '30 days' + g * interval '1 s' ELSE now() END
  FROM generate_series(1, 50000) g;
ANALYZE workspaces, connections, http_cache;
"""


def test_a_batch_of_unused_cache_entries_reads_them_by_index_and_deletes_by_tuple_id(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HTTP_CACHE)
    found = plan_of(
        admin,
        "prune_http_cache_batch",
        {"older_than": timedelta(days=7), "limit": 1000, "delete": True},
    )
    cache = scans_of(found, "http_cache")
    assert {n["Node Type"] for n in cache} == {"Index Scan", "Tid Scan"}, json.dumps(found)
    candidates = next(n for n in cache if n["Node Type"] == "Index Scan")
    assert candidates["Index Name"] == "http_cache_unused"
    assert candidates["Actual Rows"] == 1000  # of 5,000 unused entries and 45,000 used ones
