"""``/metrics`` after a scripted set of runs: it parses with the Prometheus client's own parser
and every figure matches what the database holds."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from connectors import PermanentError
from sync import Engine
from sync.testing import run_sync
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

    # Two syncs that succeed (the second finds everything unchanged), one that fails, one
    # cancelled before it started, one queued, one queued for later, one whose worker died.
    ok = connection("ok", 5)
    assert run_sync(engine, ok).status == "succeeded"
    assert run_sync(engine, ok).status == "succeeded"
    assert run_sync(engine, connection("broken", 1, fail=True)).status == "failed"
    engine.cancel_run(engine.sync(connection("cancelled", 1)).id)
    # Workers (with nothing left to claim): the three run_sync polled and "alive" are alive,
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
    expected_runs = {
        (("kind", r["kind"]), ("provider", r["provider"]), ("status", r["status"])): r["n"]
        for r in admin.execute(
            "SELECT kind, provider, status, count(*) AS n FROM connection_runs "
            "GROUP BY kind, provider, status"
        )
    }
    assert labelled(samples, "connector_sync_runs") == expected_runs
    by_status = Counter({labels[2][1]: n for labels, n in expected_runs.items()})
    assert by_status == {"succeeded": 2, "failed": 1, "cancelled": 1, "queued": 2, "running": 1}

    runs_queue = (("queue", "runs"),)
    assert samples[("connector_sync_queue_depth", runs_queue)] == 1
    assert samples[("connector_sync_queue_delayed", runs_queue)] == 1
    assert 600 <= samples[("connector_sync_queue_oldest_due_seconds", runs_queue)] < 3600
    assert samples[("connector_sync_runs_lease_expired", ())] == 1
    assert samples[("connector_sync_run_oldest_running_seconds", ())] >= 7200
    assert samples[("connector_sync_runs_waiting", ())] == 0

    # Records, from the finished syncs' per-table results, summed here by hand.
    totals: Counter[str] = Counter()
    for run in engine.runs(limit=1000):
        if run.is_terminal:
            for result in run.results.values():
                for outcome in ("upserted", "unchanged", "tombstoned"):
                    totals[outcome] += result.get(outcome, 0)
    assert totals == {"upserted": 5, "unchanged": 5, "tombstoned": 0}
    assert labelled(samples, "connector_sync_run_records") == {
        (("outcome", outcome), ("provider", "memory")): float(totals[outcome])
        for outcome in ("upserted", "unchanged", "tombstoned")
    }

    states = {labels[0][1]: n for labels, n in labelled(samples, "connector_sync_workers").items()}
    assert states == {"alive": 4, "stale": 1, "stopped": 1}


def test_an_empty_database_exports_zeros_not_gaps(engine: Engine) -> None:
    samples = scrape(engine)
    assert samples[("connector_sync_queue_depth", (("queue", "runs"),))] == 0
    assert samples[("connector_sync_queue_oldest_due_seconds", (("queue", "runs"),))] == 0
    assert labelled(samples, "connector_sync_runs") == {}
    assert {labels[0][1] for labels in labelled(samples, "connector_sync_workers")} == {
        "alive",
        "stale",
        "stopped",
    }
