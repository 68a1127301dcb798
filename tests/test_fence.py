"""The fence is written once, as ``run_fence_v1`` (sql/0012_fence_and_versions.sql), and every
fenced statement uses it; the planner inlines it, so a fenced statement still finds the run row
by its primary key, not by reading every run."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from sync import Engine
from sync.queries import QUERIES, parse
from sync.sqlfiles import sql_dir
from tests.plans import explained, nodes

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")
# The four conditions of the run fence, written out (with or without a table alias): a run's id
# (a statement's run_id, a function's p_run_id), then its owner, status and lease. The
# ingestions' own fence, on the ingestions table, has the same shape around an ingestion's id.
_WRITTEN_OUT = re.compile(
    r"(\w+\.)?id\s*=\s*\S*run_id\S*\s+AND\s+"
    r"(\w+\.)?lease_owner\s*=\s*\S+\s+AND\s+(\w+\.)?status\s*=\s*'running'\s+AND\s+"
    r"(\w+\.)?lease_expires_at\s*>\s*now\(\)",
    re.IGNORECASE,
)
_MIGRATION = re.compile(r"^(\d{4})_\w+\.sql$")

# Every named statement fenced by the run, of any file of named statements (queries.sql, and
# the ingestions' queue_file_ingestions, which a sync's files table ends with).
STATEMENTS = {
    name: query.text
    for path in sorted(sql_dir().glob("*.sql"))
    if not path.name[0].isdigit()
    for name, query in parse(path.read_text()).items()
}
FENCED = sorted(name for name, text in STATEMENTS.items() if "run_fence_v1" in text)
# Fenced inside a versioned function: the plan to check is the function's own statement (the
# finish's own UPDATE, not the lane trigger's).
FENCED_IN_FUNCTIONS = {
    "finish_run": "SET status = p_status",
    "complete_table": "SELECT 1 FROM connection_runs",
    "end_table": "SELECT 1 FROM connection_runs",
    "tombstone_unseen": "SELECT 1 FROM connection_runs",
    "unseen_rows": "SELECT 1 FROM connection_runs",
}

# The version of the function each of those named statements calls.
VERSIONS = {
    "finish_run": "v4",
    "complete_table": "v1",
    "end_table": "v1",
    "tombstone_unseen": "v2",
    "unseen_rows": "v2",
}

HISTORY = """
INSERT INTO workspaces (name) VALUES ('ws');
INSERT INTO connections (workspace_id, name, provider, config) VALUES (1, 'c', 'memory', '{}');
INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at,
                             finished_at, attempts)
SELECT 1, 1, 'memory', 'succeeded', now() - interval '30 days', now(), 1
  FROM generate_series(1, 20000) g;
ANALYZE workspaces, connections, connection_runs;
"""


def _after_the_fence() -> list[Path]:
    """Every .sql file but the migrations numbered before the one that created run_fence_v1
    (applied migrations are never edited, so those keep the conditions they wrote out)."""
    paths = sorted(sql_dir().glob("*.sql"))
    created = next(p for p in paths if "CREATE FUNCTION run_fence_v1" in p.read_text())
    number = _MIGRATION.match(created.name)
    assert number is not None

    def historic(path: Path) -> bool:
        found = _MIGRATION.match(path.name)
        return found is not None and found[1] < number[1]

    return [p for p in paths if not historic(p)]


def test_the_fence_is_written_once() -> None:
    """No named statement of any .sql file and no function of a migration made since
    run_fence_v1 exists writes the run fence's conditions out; the fenced statements the record
    writer, the lease keeper and the outcome depend on all use the function."""
    scanned = _after_the_fence()
    names = {p.name for p in scanned}
    assert {"queries.sql", "ingestions.sql", "0013_lane_parking.sql"} <= names
    assert not {"0002_queue_functions.sql", "0011_ingestions.sql"} & names
    for path in scanned:
        text = path.read_text()
        definition = text.find("CREATE FUNCTION run_fence_v1")
        if definition >= 0:  # the one place the conditions are written
            text = text[:definition] + text[text.index("$$;", definition) :]
        found = _WRITTEN_OUT.search(text)
        assert found is None, f"{path.name} writes the run fence out: {found and found[0]}"
    expected = {
        "renew_lease", "read_run_control", "lock_credentials", "requeue_run",
        "wait_for_rate_limit", "hand_back_run", "save_results", "write_record_batch",
        "save_checkpoint", "reset_table_checkpoints", "tombstone_ids", "mark_missing",
        "save_cursor", "purge_records_batch", "purge_connection_row",
        "store_response",
    }  # fmt: skip
    assert expected | {"queue_file_ingestions"} <= set(FENCED)
    for name, version in VERSIONS.items():
        assert f"{name}_{version}(" in QUERIES._by_name[name].text


def _fence_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n
        for n in nodes(plan)
        if n.get("Relation Name") == "connection_runs"
        and "lease_owner" in (n.get("Index Cond", "") + n.get("Filter", ""))
    ]


def _generic_plan(admin: Any, name: str, text: str | None = None) -> dict[str, Any]:
    """The plan the statement gets whatever its parameters (a generic plan of a PREPAREd
    statement, explained without running it)."""
    text = text or STATEMENTS[name]
    params = sorted(set(_PLACEHOLDER.findall(text)))
    numbered = _PLACEHOLDER.sub(lambda m, p=params: f"${p.index(m.group(1)) + 1}", text)
    admin.execute("SET plan_cache_mode = force_generic_plan")
    admin.execute(f"PREPARE fenced_{name} AS {numbered}")
    try:
        nulls = ", ".join(["NULL"] * len(params))
        row = admin.execute(f"EXPLAIN (FORMAT JSON) EXECUTE fenced_{name}({nulls})").fetchone()
    finally:
        admin.execute(f"DEALLOCATE fenced_{name}")
    return row["QUERY PLAN"][0]["Plan"]


# Indexes that find one run row without reading the finished history: the primary key, or a
# partial index holding only the runs that are not finished (the planner takes one of those when
# it knows of few unfinished runs).
RUN_INDEXES = {"connection_runs_pkey", "connection_runs_one_active", "connection_runs_claimable"}


def _assert_found_by_primary_key(name: str, plan: dict[str, Any]) -> None:
    scans = _fence_scans(plan)
    assert scans, f"{name}: no fenced scan of connection_runs\n{json.dumps(plan, indent=1)}"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (
            f"{name}: {scan['Node Type']}\n{json.dumps(plan, indent=1)}"
        )
        assert scan["Index Name"] in RUN_INDEXES, name
        # Inlined: the conditions are plain quals, not a call of the function per row.
        assert "run_fence_v1" not in scan.get("Filter", ""), name


def _written_out(text: str) -> str:
    """The statement with the fence's four conditions in place of the function."""
    return re.sub(
        r"run_fence_v1\((\w+), (%\(\w+\)s), (%\(\w+\)s)\)",
        lambda m: (
            f"({m[1]}.id = {m[2]} AND {m[1]}.lease_owner = {m[3]} AND {m[1]}.status = 'running'"
            f" AND {m[1]}.lease_expires_at > now())"
        ),
        text,
    )


def _shape(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(n["Node Type"], n.get("Index Name")) for n in _fence_scans(plan)]


def test_every_fenced_statement_finds_its_run_by_an_index(engine: Engine, admin: Any) -> None:
    admin.execute(HISTORY)
    for name in FENCED:
        if name not in FENCED_IN_FUNCTIONS:
            _check_statement(admin, name)


def _check_statement(admin: Any, name: str) -> None:
    plan = _generic_plan(admin, name)
    _assert_found_by_primary_key(name, plan)
    # The same plan as the four conditions written out in the statement.
    assert _shape(plan) == _shape(_generic_plan(admin, name, _written_out(STATEMENTS[name])))


def test_a_fence_the_planner_cannot_inline_reads_every_run(engine: Engine, admin: Any) -> None:
    """The check above catches a fence that is not inlined: a SET clause stops the planner
    inlining a SQL function, and the fence becomes a filter called on every run."""
    admin.execute(HISTORY)
    admin.execute("ALTER FUNCTION run_fence_v1(connection_runs, bigint, uuid) SET jit = off")
    plan = _generic_plan(admin, "save_results")
    with pytest.raises(AssertionError):
        _assert_found_by_primary_key("save_results", plan)


def test_the_fence_inside_the_versioned_functions_uses_the_primary_key(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    owner = uuid.uuid4()
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, started_at,"
        " attempts, lease_owner, lease_expires_at, worker_id)"
        " VALUES (1, 1, 'memory', 'running', now(), 1, %s, now() + interval '1 hour', 'w')",
        (owner,),
    )
    run_id = admin.execute("SELECT max(id) AS id FROM connection_runs").fetchone()["id"]
    admin.execute(
        "INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id)"
        " VALUES (%s, 1, %s, 'w')",
        (run_id, owner),
    )
    calls = {
        "finish_run": (
            "SELECT f.id IS NOT NULL AS sealed"
            " FROM finish_run_v4(%s, %s, 'succeeded', '{}', '{}', NULL, NULL, false) f",
            (run_id, owner),
        ),
        "complete_table": (
            "SELECT complete_table_v1(%s, %s, 1, 'items', '{}', true) AS fenced",
            (run_id, owner),
        ),
        "end_table": (
            "SELECT * FROM end_table_v1(%s, %s, 1, 'items', NULL, '{}', true, 100)",
            (run_id, owner),
        ),
        "tombstone_unseen": (
            "SELECT * FROM tombstone_unseen_v2(%s, %s, 1, 'items', NULL, '', 100)",
            (run_id, owner),
        ),
        "unseen_rows": (
            "SELECT * FROM unseen_rows_v2(%s, %s, 1, 'items', NULL, '', 100)",
            (run_id, owner),
        ),
    }
    for name, (statement, params) in calls.items():
        row, plans = explained(admin, statement, params)
        assert row is not None and (row.get("sealed") or row.get("fenced")), name
        marker = FENCED_IN_FUNCTIONS[name]
        inner = next((p for p in plans if marker in p["Query Text"]), None)
        assert inner is not None, (name, [p["Query Text"] for p in plans])
        _assert_found_by_primary_key(name, inner["Plan"])


def test_the_fence_refuses_another_owner_another_run_and_an_expired_lease(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    owner = uuid.uuid4()
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, started_at,"
        " attempts, lease_owner, lease_expires_at, worker_id)"
        " VALUES (1, 1, 'memory', 'running', now(), 1, %s, now() + interval '1 hour', 'w')",
        (owner,),
    )
    run_id = admin.execute("SELECT max(id) AS id FROM connection_runs").fetchone()["id"]

    def holds(owner_: uuid.UUID, run: int = run_id) -> bool:
        row = admin.execute(
            "SELECT count(*) AS n FROM connection_runs r WHERE run_fence_v1(r, %s, %s)",
            (run, owner_),
        ).fetchone()
        return bool(row["n"])

    assert holds(owner)
    assert not holds(uuid.uuid4())
    assert not holds(owner, run_id - 1)
    admin.execute("UPDATE connection_runs SET lease_expires_at = now() WHERE id = %s", (run_id,))
    assert not holds(owner)
