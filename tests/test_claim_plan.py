"""Plan regression: the claim keeps using its partial index however much history accumulates.
auto_explain reports the plans of the statements inside claim_run_v3() as they really run."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sync import Engine
from sync.store.queries import QUERIES
from tests.plans import explained, nodes

HISTORY = """
INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 20) g;
INSERT INTO connections (workspace_id, name, provider, config)
SELECT 1 + g % 20, 'c' || g, 'memory', '{"dataset": "x"}' FROM generate_series(1, 200) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at,
                             finished_at, attempts)
SELECT 1 + g % 200, 1 + (g % 200) % 20, 'memory',
       (ARRAY['succeeded', 'failed', 'cancelled', 'partial'])[1 + g % 4],
       now() - interval '30 days' + g * interval '1 second', now(), 1
  FROM generate_series(1, 100000) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status)
SELECT id, workspace_id, provider, 'queued' FROM connections WHERE id <= 5;
ANALYZE workspaces, connections, connection_runs;
"""

# The index the claim walks: the runs that are not finished nor parked behind a busy lane.
INDEX = "connection_runs_claimable_unparked"


def plans_of_claim(admin: Any) -> list[dict[str, Any]]:
    row, plans = explained(admin, "SELECT id FROM claim_run_v3('plan-test', interval '1 minute')")
    assert row is not None
    return plans


def test_the_claim_uses_its_partial_index_with_100k_finished_runs(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    plans = plans_of_claim(admin)
    candidate = next(p for p in plans if "SKIP LOCKED" in p["Query Text"])
    scans = [n for n in nodes(candidate["Plan"]) if n.get("Relation Name") == "connection_runs"]
    outer = scans[0]
    assert outer["Index Name"] == INDEX, json.dumps(candidate, indent=1)
    assert not any(n["Node Type"] == "Seq Scan" for n in scans), json.dumps(candidate, indent=1)
    # The finished history is never read: the scan touches a handful of rows and buffers, not
    # 100,000 rows.
    assert outer["Actual Rows"] + outer.get("Rows Removed by Filter", 0) <= 5
    assert outer["Shared Hit Blocks"] + outer["Shared Read Blocks"] < 20


def test_a_full_queue_without_statistics_is_walked_in_order_not_sorted(
    engine: Engine, admin: Any
) -> None:
    """A queue filled a moment ago has no statistics yet. The claim must still stop at the
    first claimable run of its index instead of sorting every due run on each call."""
    admin.execute(
        "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 50) g;"
        "INSERT INTO connections (workspace_id, name, provider) "
        "SELECT 1 + g % 50, 'c' || g, 'memory' FROM generate_series(1, 3000) g;"
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status) "
        "SELECT id, workspace_id, provider, 'queued' FROM connections"
    )
    plans = plans_of_claim(admin)
    candidate = next(p for p in plans if "SKIP LOCKED" in p["Query Text"])
    found = nodes(candidate["Plan"])
    assert not any(n["Node Type"] == "Sort" for n in found), json.dumps(candidate, indent=1)
    scans = [n for n in found if n.get("Relation Name") == "connection_runs"]
    assert scans[0]["Index Name"] == INDEX
    assert scans[0]["Actual Rows"] <= 5  # not 3,000


def test_a_claim_limited_to_its_providers_walks_the_same_index(engine: Engine, admin: Any) -> None:
    """A worker passes its provider list to the claim; the filter is checked on the rows the
    index walk meets, so the plan stays the same ordered walk of the partial index."""
    admin.execute(HISTORY)
    row, plans = explained(
        admin,
        "SELECT id, provider FROM claim_run_v3('plan-test', interval '1 minute', %s)",
        (["memory"],),
    )
    assert row is not None and row["provider"] == "memory"
    candidate = next(p for p in plans if "SKIP LOCKED" in p["Query Text"])
    found = nodes(candidate["Plan"])
    assert not any(n["Node Type"] == "Sort" for n in found), json.dumps(candidate, indent=1)
    scans = [n for n in found if n.get("Relation Name") == "connection_runs"]
    assert scans[0]["Index Name"] == INDEX
    assert scans[0]["Actual Rows"] + scans[0].get("Rows Removed by Filter", 0) <= 5


def test_a_claimed_runs_connection_is_read_by_its_primary_key(engine: Engine, admin: Any) -> None:
    """What claim_run and finish_and_claim return beside the run, written once in
    claimed_run_extras_v1: the claimed run's connection is one probe of its primary key, not a
    read of every connection (however many there are: a table of a few pages is read whole, as
    it should be)."""
    admin.execute(HISTORY)
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider, config)"
        " SELECT 1 + g % 20, 'c' || g, 'memory', '{}' FROM generate_series(201, 20000) g"
    )
    admin.execute("ANALYZE connections")
    params = {
        "worker_id": "plan-test",
        "lease": timedelta(minutes=1),
        "providers": ["memory"],
        "wakeable": False,
    }
    row, plans = explained(admin, QUERIES._by_name["claim_run"].text, params)
    assert row is not None and row["connection_name"] is not None
    extras = next(p for p in plans if "FROM connections c" in p["Query Text"])
    scans = [n for n in nodes(extras["Plan"]) if n.get("Relation Name") == "connections"]
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [
        ("Index Scan", "connections_pkey")
    ], json.dumps(extras, indent=1)
    for name in ("claim_run", "finish_and_claim"):
        assert "claimed_run_extras_v1(" in QUERIES._by_name[name].text
