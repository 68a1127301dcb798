"""Each fence is written once, as a function, and every fenced statement uses it: a run's
``run_fence_v1``, an application job's ``job_fence_v1`` and an ingestion's ``ingestion_fence_v1``
(sql/0001_baseline.sql). The planner inlines them, so a fenced statement still finds its row by
the primary key, not by reading every row."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sync import Engine
from sync.store.queries import QUERIES, parse
from sync.store.sqlfiles import sql_dir
from tests.plans import explained, nodes

_PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")
_MIGRATION = re.compile(r"^(\d{4})_\w+\.sql$")
# An argument of a fence in a statement: a placeholder, a column, NULL.
_ARGUMENT = r"(%\(\w+\)s|[\w.]+)"


@dataclass(frozen=True)
class Fence:
    function: str
    table: str
    # Its conditions written out, with or without a table alias, as a statement would: what no
    # statement may do.
    written_out: re.Pattern[str]
    # The same conditions around the function's arguments (the row, then the rest, in order):
    # what the function inlines to.
    expanded: str
    # The indexes that find one row without reading the finished history.
    indexes: frozenset[str]
    # The columns whose conditions mark a scan as the fence's.
    marks: tuple[str, ...] = ("lease_owner",)


def _conditions(*parts: str) -> re.Pattern[str]:
    return re.compile(r"\s+AND\s+".join(parts), re.IGNORECASE)


RUN_FENCE = Fence(
    "run_fence_v1",
    "connection_runs",
    # A run's id (a statement's run_id, a function's p_run_id), its owner, status and lease.
    _conditions(
        r"(\w+\.)?id\s*=\s*\S*run_id\S*",
        r"(\w+\.)?lease_owner\s*=\s*\S+",
        r"(\w+\.)?status\s*=\s*'running'",
        r"(\w+\.)?lease_expires_at\s*>\s*now\(\)",
    ),
    "({0}.id = {1} AND {0}.lease_owner = {2} AND {0}.status = 'running'"
    " AND {0}.lease_expires_at > now())",
    # The primary key, or a partial index holding only the runs that are not finished (the
    # planner takes one of those when it knows of few unfinished runs).
    frozenset({"connection_runs_pkey", "connection_runs_one_active", "connection_runs_claimable"}),
)
JOB_FENCE = Fence(
    "job_fence_v1",
    "jobs",
    # A job's id (a statement's job_id, a batch's e.id), its owner and 'active'; the expiry is
    # left out of the pattern, so a fence written out without it is found too.
    _conditions(
        r"(\w+\.)?id\s*=\s*\S+",
        r"(\w+\.)?lease_owner\s*=\s*\S+",
        r"(\w+\.)?status\s*=\s*'active'",
    ),
    "({0}.id = {1} AND {0}.lease_owner = {2} AND {0}.status = 'active'"
    " AND {0}.expires_at >= coalesce({3}, now()))",
    frozenset({"jobs_pkey"}),
    # A batch's hash join tests the owner in the join, the expiry in the scan.
    ("lease_owner", "expires_at"),
)
INGESTION_FENCE = Fence(
    "ingestion_fence_v1",
    "ingestions",
    # An ingestion's id, its owner and 'running'; the lease is left out of the pattern, so a
    # fence written out without it (as the ingestions' ends once were) is found too.
    _conditions(
        r"(\w+\.)?id\s*=\s*\S+",
        r"(\w+\.)?lease_owner\s*=\s*\S+",
        r"(\w+\.)?status\s*=\s*'running'",
    ),
    "({0}.id = {1} AND {0}.lease_owner = {2} AND {0}.status = 'running'"
    " AND {0}.lease_expires_at > now())",
    frozenset({"ingestions_pkey"}),
)
FENCES = (RUN_FENCE, JOB_FENCE, INGESTION_FENCE)
# The batched completion and lease renewal of many jobs: knowing of few active jobs, the
# planner reads them all through a partial index of the unfinished ones (the active set, never
# the finished history) and hashes the batch against them; knowing of thousands, it probes
# jobs_pkey per job.
BATCHES = {
    name: {"jobs_pkey", "jobs_expiring", "jobs_singleton"}
    for name in ("complete_attempts", "renew_job_leases")
}

# Every named statement of any file of named statements (queries.sql, queues.sql,
# ingestions.sql, ...).
STATEMENTS = {
    name: query.text
    for path in sorted(sql_dir().glob("*.sql"))
    if not path.name[0].isdigit()
    for name, query in parse(path.read_text()).items()
}


def fenced_by(fence: Fence) -> list[str]:
    return sorted(name for name, text in STATEMENTS.items() if f"{fence.function}(" in text)


# Fenced by the run: queries.sql's, and the ingestions' queue_file_ingestions, which a sync's
# files table ends with.
FENCED = fenced_by(RUN_FENCE)
# Every statement of an attempt of an application job (sql/queues.sql), and of an ingestion
# (sql/ingestions.sql), that writes or reads under its lease.
JOB_FENCED = {
    "complete_attempt", "complete_attempts", "retry_attempt", "bury_attempt",
    "hand_back_attempt", "report_progress", "renew_job_lease", "renew_job_leases",
}  # fmt: skip
INGESTION_FENCED = {
    "renew_ingestion_lease", "read_ingestion_control", "begin_ingestion",
    "record_ingestion_batch", "fence_ingestion", "finish_ingestion", "end_ingestion",
    "requeue_ingestion", "hand_back_ingestion", "hand_over_to_archive",
    "lock_ingestion_credentials",
}  # fmt: skip
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

# Jobs and ingestions, mostly finished, a few hundred of them active or running: an index of the
# unfinished ones is no shortcut to one row.
JOBS_AND_INGESTIONS = """
INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire, retention)
VALUES ('q', 'standard', 2, 1, 10, 60, 86400);
INSERT INTO jobs (queue, origin_queue, payload, status, attempts, run_after, created_at,
                  started_at, finished_at)
SELECT 'q', 'q', '{}', 'completed', 1, now() - interval '30 days', now() - interval '30 days',
       now() - interval '30 days', now() - interval '29 days'
  FROM generate_series(1, 20000) g;
INSERT INTO jobs (queue, origin_queue, payload, status, attempts, run_after, created_at,
                  started_at, expires_at, deadline_at, lease_owner)
SELECT 'q', 'q', '{}', 'active', 1, now(), now(), now(), now() + interval '1 minute',
       now() + interval '1 minute', gen_random_uuid()
  FROM generate_series(1, 300) g;
INSERT INTO ingestions (workspace_id, source, local_path, source_hash, max_attempts, status,
                        finished_at)
SELECT 1, 'local', '/files/' || g, '\\x00', 3, 'ready', now() FROM generate_series(1, 20000) g;
INSERT INTO ingestions (workspace_id, source, local_path, source_hash, max_attempts, status,
                        started_at, attempts, lease_owner, lease_expires_at, worker_id)
SELECT 1, 'local', '/running/' || g, '\\x00', 3, 'running', now(), 1, gen_random_uuid(),
       now() + interval '1 hour', 'w'
  FROM generate_series(1, 300) g;
ANALYZE job_queues, jobs, ingestions;
"""


def _after(fence: Fence) -> list[Path]:
    """Every .sql file but the migrations numbered before the one that created the fence's
    function (applied migrations are never edited, so those keep the conditions they wrote
    out)."""
    paths = sorted(sql_dir().glob("*.sql"))
    created = next(p for p in paths if f"CREATE FUNCTION {fence.function}(" in p.read_text())
    number = _MIGRATION.match(created.name)
    assert number is not None

    def historic(path: Path) -> bool:
        found = _MIGRATION.match(path.name)
        return found is not None and found[1] < number[1]

    return [p for p in paths if not historic(p)]


def _written_out_in(fence: Fence, text: str) -> str | None:
    """The fence's conditions where ``text`` writes them out, outside the fences' own
    definitions (the one place each is written; the run's and the ingestion's look alike)."""
    for each in FENCES:
        definition = text.find(f"CREATE FUNCTION {each.function}(")
        if definition >= 0:
            text = text[:definition] + text[text.index("$$;", definition) :]
    found = fence.written_out.search(text)
    return found[0] if found else None


def test_the_fence_is_written_once() -> None:
    """No named statement of any .sql file and no function of a migration made since a fence's
    function exists writes that fence's conditions out; the fenced statements the record
    writer, the lease keeper, the outcome, the jobs' attempts and the ingestions depend on all
    use the function."""
    scanned = {fence.function: _after(fence) for fence in FENCES}
    for fence in FENCES:
        names = {p.name for p in scanned[fence.function]}
        assert {"queries.sql", "queues.sql", "ingestions.sql", "0001_baseline.sql"} <= names
        for path in scanned[fence.function]:
            found = _written_out_in(fence, path.read_text())
            assert found is None, f"{path.name} writes {fence.function} out: {found}"
    expected = {
        "renew_lease", "read_run_control", "lock_credentials", "requeue_run",
        "wait_for_rate_limit", "hand_back_run", "save_results", "write_record_batch",
        "open_record_append", "save_checkpoint", "reset_table_checkpoints", "tombstone_ids",
        "mark_missing", "save_cursor", "purge_records_batch", "purge_connection_row",
        "store_response",
    }  # fmt: skip
    assert expected | {"queue_file_ingestions"} <= set(FENCED)
    for name, version in VERSIONS.items():
        assert f"{name}_{version}(" in QUERIES._by_name[name].text
    assert set(fenced_by(JOB_FENCE)) == JOB_FENCED
    assert set(fenced_by(INGESTION_FENCE)) == INGESTION_FENCED


def _written_out(fence: Fence, text: str) -> str:
    """The statement with the fence's conditions in place of the function."""
    arguments = len(set(re.findall(r"\{(\d)\}", fence.expanded))) - 1
    call = rf"{fence.function}\((\w+)" + rf", {_ARGUMENT}" * arguments + r"\)"
    return re.sub(call, lambda m: fence.expanded.format(*m.groups()), text)


def test_the_check_finds_every_fence_written_out() -> None:
    """The check above is no formality: each fenced statement, with its fence written out in
    its place, is found."""
    for fence in FENCES:
        for name in fenced_by(fence):
            text = _written_out(fence, STATEMENTS[name])
            assert fence.function not in text, name
            assert _written_out_in(fence, text), (fence.function, name)


_CONDITIONS = ("Index Cond", "Recheck Cond", "Filter")


def _fence_scans(plan: dict[str, Any], fence: Fence = RUN_FENCE) -> list[dict[str, Any]]:
    """The scans of the fence's table that test its conditions."""
    return [
        n
        for n in nodes(plan)
        if n.get("Relation Name") == fence.table
        and any(mark in n.get(key, "") for key in _CONDITIONS for mark in fence.marks)
    ]


def _indexes(scan: dict[str, Any]) -> set[str]:
    """The indexes a scan reads: its own, or those of a bitmap scan's index scans (not those
    of a subplan below it)."""
    if "Index Name" in scan:
        return {scan["Index Name"]}
    return {
        name
        for child in scan.get("Plans", [])
        if child["Node Type"] in ("Bitmap Index Scan", "BitmapAnd", "BitmapOr")
        for name in _indexes(child)
    }


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


def _assert_found_by_primary_key(name: str, plan: dict[str, Any], fence: Fence = RUN_FENCE) -> None:
    scans = _fence_scans(plan, fence)
    assert scans, f"{name}: no fenced scan of {fence.table}\n{json.dumps(plan, indent=1)}"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), (
            f"{name}: {scan['Node Type']}\n{json.dumps(plan, indent=1)}"
        )
        found = _indexes(scan)
        assert found and found <= fence.indexes | BATCHES.get(name, set()), (name, found)
        # Inlined: the conditions are plain quals, not a call of the function per row.
        assert not any(fence.function in scan.get(key, "") for key in _CONDITIONS), name


def _shape(plan: dict[str, Any], fence: Fence = RUN_FENCE) -> list[tuple[str, list[str]]]:
    return [(n["Node Type"], sorted(_indexes(n))) for n in _fence_scans(plan, fence)]


def test_every_fenced_statement_finds_its_run_by_an_index(engine: Engine, admin: Any) -> None:
    admin.execute(HISTORY)
    for name in FENCED:
        if name not in FENCED_IN_FUNCTIONS:
            _check_statement(admin, name, RUN_FENCE)


def test_every_fenced_job_and_ingestion_statement_finds_its_row_by_the_primary_key(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    admin.execute(JOBS_AND_INGESTIONS)
    for fence in (JOB_FENCE, INGESTION_FENCE):
        for name in fenced_by(fence):
            _check_statement(admin, name, fence)


def _check_statement(admin: Any, name: str, fence: Fence) -> None:
    plan = _generic_plan(admin, name)
    _assert_found_by_primary_key(name, plan, fence)
    # The same plan as the conditions written out in the statement.
    written_out = _generic_plan(admin, name, _written_out(fence, STATEMENTS[name]))
    assert _shape(plan, fence) == _shape(written_out, fence), name


@pytest.mark.parametrize(
    ("fence", "signature", "name"),
    [
        (RUN_FENCE, "connection_runs, bigint, uuid", "save_results"),
        (JOB_FENCE, "jobs, bigint, uuid, timestamptz", "report_progress"),
        (INGESTION_FENCE, "ingestions, bigint, uuid", "end_ingestion"),
    ],
    ids=lambda value: value.function if isinstance(value, Fence) else None,
)
def test_a_fence_the_planner_cannot_inline_reads_every_row(
    engine: Engine, admin: Any, fence: Fence, signature: str, name: str
) -> None:
    """The checks above catch a fence that is not inlined: a SET clause stops the planner
    inlining a SQL function, and the fence becomes a filter called on every row."""
    admin.execute(HISTORY)
    admin.execute(JOBS_AND_INGESTIONS)
    admin.execute(f"ALTER FUNCTION {fence.function}({signature}) SET jit = off")
    plan = _generic_plan(admin, name)
    with pytest.raises(AssertionError):
        _assert_found_by_primary_key(name, plan, fence)


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


def test_the_job_fence_refuses_another_owner_another_job_an_inactive_job_and_an_expiry(
    engine: Engine, admin: Any
) -> None:
    """job_fence_v1 holds while the job is active under the token and its lease has not run
    out by the caller's clock, or the database's when the caller gives none (NULL)."""
    admin.execute(HISTORY)
    admin.execute(JOBS_AND_INGESTIONS)
    owner = uuid.uuid4()
    job_id = admin.execute(
        "UPDATE jobs SET lease_owner = %s WHERE id = (SELECT max(id) FROM jobs) RETURNING id",
        (owner,),
    ).fetchone()["id"]
    expires_at = admin.execute("SELECT expires_at FROM jobs WHERE id = %s", (job_id,)).fetchone()[
        "expires_at"
    ]

    def holds(owner_: uuid.UUID, job: int = job_id, now: Any = None) -> bool:
        row = admin.execute(
            "SELECT count(*) AS n FROM jobs j WHERE job_fence_v1(j, %s, %s, %s)",
            (job, owner_, now),
        ).fetchone()
        return bool(row["n"])

    assert holds(owner)
    assert holds(owner, now=expires_at)  # up to its expiry, inclusive
    assert not holds(owner, now=expires_at + timedelta(microseconds=1))
    assert not holds(uuid.uuid4())
    assert not holds(owner, job_id - 1)
    admin.execute(
        "UPDATE jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (job_id,)
    )
    assert not holds(owner)  # NULL: the database's now
    assert holds(owner, now=expires_at - timedelta(minutes=2))  # a clock of the past
    admin.execute("UPDATE jobs SET status = 'retrying' WHERE id = %s", (job_id,))
    assert not holds(owner, now=expires_at - timedelta(minutes=2))


def test_the_ingestion_fence_refuses_another_owner_another_ingestion_and_an_expired_lease(
    engine: Engine, admin: Any
) -> None:
    admin.execute(HISTORY)
    admin.execute(JOBS_AND_INGESTIONS)
    owner = uuid.uuid4()
    ingestion_id = admin.execute(
        "UPDATE ingestions SET lease_owner = %s WHERE id = (SELECT max(id) FROM ingestions)"
        " RETURNING id",
        (owner,),
    ).fetchone()["id"]

    def holds(owner_: uuid.UUID, ingestion: int = ingestion_id) -> bool:
        row = admin.execute(
            "SELECT count(*) AS n FROM ingestions i WHERE ingestion_fence_v1(i, %s, %s)",
            (ingestion, owner_),
        ).fetchone()
        return bool(row["n"])

    assert holds(owner)
    assert not holds(uuid.uuid4())
    assert not holds(owner, ingestion_id - 1)
    # Expired and not claimed again yet: the claim already treats it as free, so no write
    # (an end included) passes.
    admin.execute("UPDATE ingestions SET lease_expires_at = now() WHERE id = %s", (ingestion_id,))
    assert not holds(owner)
