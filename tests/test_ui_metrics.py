"""``/metrics`` after a scripted set of runs: it parses with the Prometheus client's own parser
and every figure matches what the database holds."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from connectors import PermanentError
from sync import Engine
from sync.queues import queue_spec
from sync.store.queries import QUERIES
from sync.testing import run_sync
from tests.plans import explained, nodes
from tests.test_sync_flow import items, new_dataset
from tests.ui_support import serving

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(engine: Engine) -> Samples:
    with serving(engine) as url:
        response = httpx.get(f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def labelled(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def test_metrics_match_the_database_after_a_scripted_set_of_runs(
    engine: Engine, admin: Any
) -> None:
    ws = engine.create_workspace("acme")

    def connection(name: str, rows: int, fail: bool = False) -> int:
        key, data = new_dataset(items=items(*range(rows)))
        if fail:
            data.failures["items"] = (0, PermanentError("the provider refused"))
            data.failures["notes"] = (0, PermanentError("the provider refused"))
        return engine.create_connection(ws.id, name, "memory", config={"dataset": key}).id

    # Two syncs that succeed (the second finds everything unchanged), one that fails, one that
    # failed two hours ago, one cancelled before it started, one queued, one queued for later,
    # one whose worker died.
    ok = connection("ok", 5)
    assert run_sync(engine, ok).status == "succeeded"
    assert run_sync(engine, ok).status == "succeeded"
    assert run_sync(engine, connection("broken", 1, fail=True)).status == "failed"
    old_failure = run_sync(engine, connection("broken long ago", 1, fail=True))
    admin.execute(
        "UPDATE connection_runs SET finished_at = now() - interval '2 hours' WHERE id = %s",
        (old_failure.id,),
    )
    engine.cancel_run(engine.sync(connection("cancelled", 1)).id)
    # Workers (with nothing left to claim): the four run_sync polled and "alive" are alive,
    # "silent" has sent no heartbeat for an hour, "gone" stopped.
    engine.worker(listen=False, worker_id="alive").poll()
    engine.worker(listen=False, worker_id="silent").poll()
    admin.execute("UPDATE workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'silent'")
    gone = engine.worker(listen=False, worker_id="gone")
    gone.poll()
    gone.close()
    queued = engine.sync(connection("queued", 1))
    admin.execute(
        "UPDATE connection_runs SET queued_at = now() - interval '10 minutes' WHERE id = %s",
        (queued.id,),
    )
    later = engine.sync(connection("later", 1))
    admin.execute(
        "UPDATE connection_runs SET queued_at = now() + interval '1 hour' WHERE id = %s",
        (later.id,),
    )
    crashed = engine.sync(connection("crashed", 1))
    admin.execute(
        "UPDATE connection_runs SET status = 'running', attempts = 1, "
        "lease_owner = gen_random_uuid(), started_at = now() - interval '2 hours', "
        "lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        (crashed.id,),
    )

    samples = scrape(engine)

    assert samples[("connector_sync_database_up", ())] == 1

    def counts(where: str) -> dict[tuple[tuple[str, str], ...], int]:
        rows = admin.execute(
            "SELECT kind, provider, status, count(*) AS n FROM connection_runs "
            f"WHERE {where} GROUP BY kind, provider, status"
        )
        return {
            (("kind", r["kind"]), ("provider", r["provider"]), ("status", r["status"])): r["n"]
            for r in rows
        }

    live = counts("status IN ('waiting', 'queued', 'running')")
    assert labelled(samples, "connector_sync_runs") == live
    assert Counter({labels[2][1]: n for labels, n in live.items()}) == {"queued": 2, "running": 1}
    finished = counts("finished_at > now() - interval '1 hour'")
    assert labelled(samples, "connector_sync_runs_finished") == finished
    assert Counter({labels[2][1]: n for labels, n in finished.items()}) == {
        "succeeded": 2,
        "cancelled": 1,
        "failed": 1,
    }
    # Dead letters count every failed run, the one that failed before the window too.
    dead = {(k, p): n for (k, p, _), n in counts("status = 'failed'").items()}
    assert labelled(samples, "connector_sync_runs_dead_letters") == dead
    assert sum(dead.values()) == 2

    runs_queue = (("queue", "runs"),)
    assert samples[("connector_sync_queue_depth", runs_queue)] == 1
    assert samples[("connector_sync_queue_delayed", runs_queue)] == 1
    assert 600 <= samples[("connector_sync_queue_oldest_due_seconds", runs_queue)] < 3600
    assert samples[("connector_sync_runs_lease_expired", ())] == 1
    assert samples[("connector_sync_run_oldest_running_seconds", ())] >= 7200
    assert samples[("connector_sync_runs_waiting", ())] == 0

    # Records, from the per-table results of the syncs finished in the hour, summed by hand.
    totals: Counter[str] = Counter()
    for run in engine.runs(limit=1000):
        if run.is_terminal and run.id != old_failure.id:
            for result in run.results.values():
                for outcome in ("upserted", "unchanged", "tombstoned"):
                    totals[outcome] += result.get(outcome, 0)
    assert totals == {"upserted": 5, "unchanged": 5, "tombstoned": 0}
    assert labelled(samples, "connector_sync_run_records") == {
        (("outcome", outcome), ("provider", "memory")): float(totals[outcome])
        for outcome in ("upserted", "unchanged", "tombstoned")
    }

    states = {labels[0][1]: n for labels, n in labelled(samples, "connector_sync_workers").items()}
    assert states == {"alive": 5, "stale": 1, "stopped": 1}


def test_an_empty_database_exports_zeros_not_gaps(engine: Engine) -> None:
    samples = scrape(engine)
    assert samples[("connector_sync_queue_depth", (("queue", "runs"),))] == 0
    assert samples[("connector_sync_queue_oldest_due_seconds", (("queue", "runs"),))] == 0
    assert labelled(samples, "connector_sync_runs") == {}
    assert labelled(samples, "connector_sync_runs_finished") == {}
    assert labelled(samples, "connector_sync_runs_dead_letters") == {}
    assert {labels[0][1] for labels in labelled(samples, "connector_sync_workers")} == {
        "alive",
        "stale",
        "stopped",
    }


HISTORY = """
INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 20) g;
INSERT INTO connections (workspace_id, name, provider)
SELECT 1 + g % 20, 'c' || g, 'memory' FROM generate_series(1, 200) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, attempts,
                             queued_at, started_at, finished_at, results)
SELECT 1 + g % 200, 1 + (g % 200) % 20, 'memory',
       CASE WHEN g % 1000 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
       '{"items": {"status": "succeeded", "upserted": 3, "unchanged": 9, "tombstoned": 0}}'
  FROM generate_series(1, 100000) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status)
SELECT id, workspace_id, provider, 'queued' FROM connections WHERE id <= 5;
"""


def test_a_scrape_reads_no_history_outside_its_window(engine: Engine, admin: Any) -> None:
    """With 100,000 runs that finished days ago (100 of them failed), the snapshot reads only
    the indexes of what it counts: no sequential scan of connection_runs, a few hundred
    buffers, not the table."""
    admin.execute(HISTORY)
    admin.execute("VACUUM ANALYZE connection_runs")  # as autovacuum leaves a settled table
    row, plans = explained(
        admin, QUERIES.metrics_snapshot, {"window_seconds": 3600, "stale_after_seconds": 45}
    )
    assert row is not None and row["finished"] == [] and len(row["live"]) == 1
    assert row["dead"] == [{"kind": "sync", "provider": "memory", "count": 100}]
    plan = plans[-1]["Plan"]
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "connection_runs"]
    assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), scans
    # Each dead letter may cost one visit of its table page (when other sessions keep VACUUM
    # from marking pages all-visible), the rest is index pages: far from the table's size.
    touched = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in scans)
    table_blocks = admin.execute(
        "SELECT relpages FROM pg_class WHERE oid = 'connection_runs'::regclass"
    ).fetchone()["relpages"]
    assert touched < 300 < table_blocks, (touched, table_blocks)


def test_application_queues_are_exported_per_queue_as_the_database_counts_them(
    engine: Engine, admin: Any
) -> None:
    """Per application queue: due, delayed and active jobs, the oldest due one's wait and the
    dead letters, beside the run queue, equal to counts taken by hand."""
    queues = engine.queues
    queues.declare_queue(queue_spec("mail.dead"))
    queues.declare_queue(queue_spec("mail", retry_limit=0, dead_letter="mail.dead"))
    queues.declare_queue(queue_spec("idle"))

    def fail(job: Any, abort: Any) -> None:
        raise RuntimeError("refused")

    queues.register("mail", fail)
    for n in range(2):
        queues.send("mail", {"n": n})
    queues.run_due()  # both die into mail.dead
    waiting = [queues.send("mail", {"n": n}) for n in range(3)]
    admin.execute(
        "UPDATE jobs SET run_after = now() - interval '20 minutes' WHERE id = %s", (waiting[0],)
    )
    queues.send("mail", {"later": True}, start_after=timedelta(hours=1))
    running = queues.send("mail", {"running": True})
    admin.execute(
        "UPDATE jobs SET status = 'active', attempts = 1, started_at = now(), "
        "expires_at = now() + interval '1 hour', lease_owner = gen_random_uuid() WHERE id = %s",
        (running,),
    )

    samples = scrape(engine)

    def by_queue(name: str) -> dict[str, float]:
        return {dict(labels)["queue"]: v for labels, v in labelled(samples, name).items()}

    by_hand = {
        r["queue"]: r
        for r in admin.execute(
            "SELECT queue, count(*) FILTER (WHERE status IN ('queued', 'retrying') "
            "AND run_after <= now()) AS due, count(*) FILTER (WHERE status IN ('queued', "
            "'retrying') AND run_after > now()) AS delayed, count(*) FILTER (WHERE status = "
            "'active') AS active, count(*) FILTER (WHERE status = 'dead') AS dead "
            "FROM jobs GROUP BY queue"
        )
    }
    assert by_queue("connector_sync_queue_depth") == {
        "runs": 0,
        "idle": 0,
        "mail": by_hand["mail"]["due"],
        "mail.dead": 0,
    }
    assert by_hand["mail"]["due"] == 3 and by_hand["mail"]["delayed"] == 1
    assert by_queue("connector_sync_queue_delayed")["mail"] == 1
    assert by_queue("connector_sync_queue_active") == {"idle": 0, "mail": 1, "mail.dead": 0}
    assert by_queue("connector_sync_queue_dead_letters") == {
        "idle": 0,
        "mail": 0,
        "mail.dead": by_hand["mail.dead"]["dead"],
    }
    assert by_hand["mail.dead"]["dead"] == 2
    oldest = by_queue("connector_sync_queue_oldest_due_seconds")
    assert 1200 <= oldest["mail"] < 3600 and oldest["idle"] == 0 and oldest["runs"] == 0


JOBS_HISTORY = """
INSERT INTO jobs (queue, origin_queue, payload, status, attempts, run_after, created_at,
                  finished_at)
SELECT 'mail', 'mail', '{}', 'completed', 1, now() - interval '1 day', now() - interval '1 day',
       now() - interval '1 day'
  FROM generate_series(1, 30000) g;
INSERT INTO jobs (queue, origin_queue, payload, status, attempts, run_after, created_at,
                  finished_at)
SELECT 'mail.dead', 'mail', '{}', 'dead', 3, now(), now(), now() FROM generate_series(1, 20) g;
INSERT INTO jobs (queue, origin_queue, payload, status, run_after, created_at)
SELECT 'mail', 'mail', '{}', 'queued', now(), now() FROM generate_series(1, 50) g;
"""


def test_a_scrape_reads_no_finished_job_to_count_dead_letters(engine: Engine, admin: Any) -> None:
    """With 30,000 completed jobs kept by retention, the application queues' part of the
    snapshot reads the waiting, active and dead jobs through indexes that hold only those,
    never the table."""
    engine.queues.declare_queue(queue_spec("mail.dead"))
    engine.queues.declare_queue(queue_spec("mail", dead_letter="mail.dead"))
    admin.execute(JOBS_HISTORY)
    admin.execute("VACUUM ANALYZE jobs")
    row, plans = explained(
        admin, QUERIES.metrics_snapshot, {"window_seconds": 3600, "stale_after_seconds": 45}
    )
    assert row is not None
    figures = {q["name"]: q for q in row["app_queues"]}
    assert (figures["mail.dead"]["dead"], figures["mail"]["due"]) == (20, 50)
    scans = [n for n in nodes(plans[-1]["Plan"]) if n.get("Relation Name") == "jobs"]
    assert scans and not any(n["Node Type"] == "Seq Scan" for n in scans), scans
    touched = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in scans)
    table_blocks = admin.execute(
        "SELECT relpages FROM pg_class WHERE oid = 'jobs'::regclass"
    ).fetchone()["relpages"]
    assert touched < 50 < table_blocks, (touched, table_blocks)
