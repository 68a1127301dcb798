"""Plan regression: a step of the tombstone pass reads one step's rows, not the rest of the
table. (A step whose upper key reached its UPDATE only as a filter read every stored row and
seen key after it: a pass over N rows read about N^2 / 2 * step rows.)"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sync import Engine
from tests.plans import explained, nodes

ROWS, STEP, START = 20_000, 1_000, 10_000

SETUP = """
INSERT INTO workspaces (name) VALUES ('ws');
INSERT INTO connections (workspace_id, name, provider) VALUES (1, 'c', 'memory');
INSERT INTO records (connection_id, table_name, external_id, data, content_hash, written_by)
SELECT 1, 'items', lpad(g::text, 6, '0'), '{}', '\\x00', gen_random_uuid()
  FROM generate_series(1, %(rows)s) g;
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, started_at,
                             attempts, lease_owner, lease_expires_at, worker_id)
VALUES (1, 1, 'memory', 'running', now(), 1, %(owner)s, now() + interval '1 hour', 'plan-test');
INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id) VALUES (1, 1, %(owner)s, 'w');
INSERT INTO run_seen_keys (run_id, table_name, external_id)
SELECT 1, 'items', lpad(g::text, 6, '0')
  FROM generate_series(1, %(rows)s) g WHERE g %% 100 <> 0;
"""


def test_a_tombstone_step_reads_one_step_of_rows(engine: Engine, admin: Any) -> None:
    owner = uuid.uuid4()
    for statement in SETUP.split(";")[:-1]:
        admin.execute(statement, {"rows": ROWS, "owner": owner})
    run_id = admin.execute("SELECT id FROM connection_runs").fetchone()["id"]
    row, plans = explained(
        admin,
        "SELECT * FROM tombstone_unseen_v2(%s, %s, 1, 'items', NULL, %s, %s)",
        (run_id, owner, f"{START:06d}", STEP),
    )
    # Keys START+1 .. START+STEP; every 100th was not seen.
    assert row["fenced"] and row["scanned"] == STEP and row["tombstoned"] == {"": STEP // 100}

    update = next(p for p in plans if "UPDATE records" in p["Query Text"])
    scans = [
        n for n in nodes(update["Plan"]) if n.get("Relation Name") in ("records", "run_seen_keys")
    ]
    assert {n["Relation Name"] for n in scans} == {"records", "run_seen_keys"}
    for scan in scans:
        read = scan["Actual Rows"] * scan["Actual Loops"] + scan.get("Rows Removed by Filter", 0)
        # One step's rows, not the ROWS - START after it.
        assert read <= STEP, json.dumps(update, indent=1)
