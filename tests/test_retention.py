"""Retention: a pass deletes exactly what its rules say and nothing else, in bounded batches,
never a row a live run needs, and ``prune --dry-run`` counts the same rows without deleting
them. Ages are made by SQL (``now() - interval``), so nothing waits for time to pass."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from sync import Engine
from sync.cli import main
from sync.store import RunStore
from sync.store.queries import QUERIES
from sync.worker.services import Retained
from tests.conftest import DATABASE_URL, make_settings
from tests.waiting import wait_until_blocked

TERMINAL = ("succeeded", "partial", "failed", "cancelled")


def add_runs(
    admin: Any,
    connection_id: int | None,
    count: int,
    *,
    age: str,
    status: str = "succeeded",
    deleted_connection_id: int | None = None,
) -> list[int]:
    """``count`` runs of a connection (or of a deleted one), each with two attempts and a
    checkpoint, that finished ``age`` ago (terminal statuses) or were queued then."""
    finished = "now() - %(age)s::interval" if status in TERMINAL else "NULL"
    rows = admin.execute(
        f"""
        INSERT INTO connection_runs (connection_id, deleted_connection_id, workspace_id,
                                     provider, status, queued_at, finished_at, attempts)
        SELECT %(connection_id)s, %(deleted)s, 1, 'memory', %(status)s,
               now() - %(age)s::interval, {finished}, 2
          FROM generate_series(1, %(count)s)
        RETURNING id
        """,
        {
            "connection_id": connection_id,
            "deleted": deleted_connection_id,
            "status": status,
            "age": age,
            "count": count,
        },
    ).fetchall()
    ids = [r["id"] for r in rows]
    admin.execute(
        "INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id) "
        "SELECT id, a, gen_random_uuid(), 'w' FROM unnest(%s::bigint[]) id, "
        "generate_series(1, 2) a",
        (ids,),
    )
    admin.execute(
        "INSERT INTO run_checkpoints (run_id, table_name, first_attempt) "
        "SELECT id, 'items', 0 FROM unnest(%s::bigint[]) id",
        (ids,),
    )
    return ids


def ids(admin: Any, query: str) -> set[Any]:
    return {next(iter(r.values())) for r in admin.execute(query).fetchall()}


@pytest.fixture
def history(engine: Engine, admin: Any) -> dict[str, Any]:
    """A history with something on either side of every rule."""
    admin.execute("INSERT INTO workspaces (name) VALUES ('acme')")
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider) "
        "SELECT 1, 'c' || g, 'memory' FROM generate_series(1, 6) g"
    )
    h: dict[str, Any] = {}
    # Connection 1: 30 runs 40 days old, then 3 recent ones. The newest 20 are kept: the 3
    # recent ones and the 17 newest old ones; the 13 oldest go.
    old = add_runs(admin, 1, 30, age="40 days")
    recent = add_runs(admin, 1, 3, age="1 hour", status="failed")
    h["doomed"] = set(old[:13])
    # Connection 2: 5 old runs, all within its newest 20.
    kept = set(old[13:]) | set(recent) | set(add_runs(admin, 2, 5, age="90 days"))
    # A deleted connection's runs go by age alone: 4 old ones go, a 10-day-old one stays.
    h["doomed"] |= set(add_runs(admin, None, 4, age="40 days", deleted_connection_id=99))
    kept |= set(add_runs(admin, None, 1, age="10 days", deleted_connection_id=99))
    # Runs not finished are never deleted, however old and however many newer runs their
    # connection has: a queued one 60 days old behind 25 old finished ones (of which 5 go)...
    kept_queued = add_runs(admin, 3, 1, age="60 days", status="queued")
    kept |= set(kept_queued)
    connection_3 = add_runs(admin, 3, 25, age="50 days", status="cancelled")
    h["doomed"] |= set(connection_3[:5])
    kept |= set(connection_3[5:])
    # ...one running for 60 days under a live lease, and a purge waiting 60 days.
    running = admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at, "
        "started_at, attempts, lease_owner, lease_expires_at) VALUES (4, 1, 'memory', "
        "'running', now() - interval '60 days', now() - interval '60 days', 1, "
        "gen_random_uuid(), now() + interval '1 hour') RETURNING id"
    ).fetchone()["id"]
    waiting = admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, kind, status, "
        "queued_at) VALUES (4, 1, 'memory', 'purge', 'waiting', now() - interval '60 days') "
        "RETURNING id"
    ).fetchone()["id"]
    # A queued run with a finished_at of long ago (a run retried by an older version that
    # left the field set), behind 20 newer runs: its status alone keeps it.
    stale_finish = add_runs(admin, 5, 1, age="60 days", status="queued")
    admin.execute(
        "UPDATE connection_runs SET finished_at = now() - interval '60 days' WHERE id = %s",
        (stale_finish[0],),
    )
    kept |= {running, waiting, *stale_finish, *add_runs(admin, 5, 20, age="1 hour")}
    h["kept"] = kept
    h["without_attempts"] = {running, waiting}
    h["queued"] = kept_queued[0]

    # Seen keys: of a doomed run and of a recent finished run (both ended: they go), of the
    # queued and the running run (they stay).
    for run_id, keys in ((old[0], 3), (recent[0], 2), (h["queued"], 4), (running, 1)):
        admin.execute(
            "INSERT INTO run_seen_keys SELECT %s, 'items', g::text FROM generate_series(1, %s) g",
            (run_id, keys),
        )
    h["seen_kept"] = {(h["queued"], 4), (running, 1)}

    admin.execute(
        "INSERT INTO workers (id, hostname, pid, version, heartbeat_at, stopped_at) VALUES "
        "('stopped-2-days', 'h', 1, 'v', now() - interval '2 days', now() - interval '2 days'),"
        "('silent-2-days', 'h', 2, 'v', now() - interval '2 days', NULL),"
        "('stopped-2-hours', 'h', 3, 'v', now() - interval '2 hours', now() - interval '2 hours'),"
        "('alive', 'h', 4, 'v', now(), NULL)"
    )
    admin.execute(
        "INSERT INTO rate_budgets (key, blocked_until, reason) VALUES "
        "('ended', now() - interval '1 minute', '429'), ('blocked', now() + interval '1 hour', "
        "'429')"
    )
    admin.execute(
        "INSERT INTO records (connection_id, table_name, external_id, data, content_hash, "
        "written_by, deleted_at) SELECT 1, 'items', id, '{}', '\\x00', gen_random_uuid(), "
        "now() - age FROM (VALUES ('gone-100-days', interval '100 days'), "
        "('gone-1-day', interval '1 day'), ('live', NULL)) AS r(id, age)"
    )
    # The ETag cache: an entry nobody asked for in 8 days goes (7 by default); one asked for an
    # hour ago stays, however long ago it was stored.
    admin.execute(
        "INSERT INTO http_cache (connection_id, url_hash, etag, headers, body, stored_at, "
        "used_at) VALUES "
        "(1, 'unused', '\"a\"', '{}', '', now() - interval '8 days', now() - interval '8 days'), "
        "(1, 'asked', '\"b\"', '{}', '', now() - interval '30 days', now() - interval '1 hour')"
    )
    return h


def remaining_runs(admin: Any) -> set[int]:
    return ids(admin, "SELECT id FROM connection_runs")


def test_prune_deletes_exactly_what_the_rules_say(
    engine: Engine, admin: Any, history: dict[str, Any]
) -> None:
    everything = remaining_runs(admin)
    assert everything == history["doomed"] | history["kept"]

    dry = engine.prune(dry_run=True)
    assert remaining_runs(admin) == everything  # a dry run deletes nothing
    report = engine.prune()

    expected = {
        Retained.RUNS: len(history["doomed"]),
        Retained.ATTEMPTS: 2 * len(history["doomed"]),
        Retained.SEEN_KEYS: 5,
        Retained.WORKERS: 2,
        Retained.RATE_BUDGETS: 1,
        Retained.HTTP_CACHE: 1,
        Retained.JOBS: 0,
        Retained.JOB_ATTEMPTS: 0,
        Retained.INGESTIONS: 0,
        Retained.TOMBSTONES: 0,
    }
    assert report.deleted == expected
    assert dry.deleted == expected and dry.dry_run and not report.dry_run

    assert remaining_runs(admin) == history["kept"]
    # Attempts and checkpoints went with their runs, and only with them.
    with_attempts = history["kept"] - history["without_attempts"]
    assert ids(admin, "SELECT run_id FROM run_attempts") == with_attempts
    assert len(ids(admin, "SELECT id FROM run_attempts")) == 2 * len(with_attempts)
    assert ids(admin, "SELECT run_id FROM run_checkpoints") == with_attempts
    seen = admin.execute(
        "SELECT run_id, count(*) AS n FROM run_seen_keys GROUP BY run_id"
    ).fetchall()
    assert {(r["run_id"], r["n"]) for r in seen} == history["seen_kept"]
    assert ids(admin, "SELECT id FROM workers") == {"stopped-2-hours", "alive"}
    assert ids(admin, "SELECT key FROM rate_budgets") == {"blocked"}
    assert ids(admin, "SELECT convert_from(url_hash, 'UTF8') FROM http_cache") == {"asked"}
    # tombstone_days is unset: every tombstone is kept.
    assert ids(admin, "SELECT external_id FROM records") == {"gone-100-days", "gone-1-day", "live"}

    # Nothing is left to delete.
    assert set(engine.prune().deleted.values()) == {0}


def test_old_tombstones_go_only_when_tombstone_days_is_set(
    schema: str, engine: Engine, admin: Any, history: dict[str, Any]
) -> None:
    with Engine(make_settings(schema, tombstone_days=30)) as keeping_30_days:
        dry = keeping_30_days.prune(dry_run=True)
        assert dry.deleted[Retained.TOMBSTONES] == 1
        assert keeping_30_days.prune().deleted[Retained.TOMBSTONES] == 1
    assert ids(admin, "SELECT external_id FROM records") == {"gone-1-day", "live"}


def test_a_pass_deletes_in_bounded_batches_and_walks_each_run_once(
    schema: str, engine: Engine, admin: Any
) -> None:
    admin.execute("INSERT INTO workspaces (name) VALUES ('acme')")
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider) "
        "SELECT 1, 'c' || g, 'memory' FROM generate_series(1, 3) g"
    )
    # Three connections' runs interleaved in time: 3 x 30 old runs, 3 x 20 kept.
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at, "
        "finished_at) SELECT 1 + g % 3, 1, 'memory', 'succeeded', now() - interval '40 days', "
        "now() - interval '40 days' + g * interval '1 second' FROM generate_series(1, 90) g"
    )
    # And 20 ETag cache entries nobody asked for in 30 days.
    admin.execute(
        "INSERT INTO http_cache (connection_id, url_hash, etag, headers, body, used_at) "
        "SELECT 1, int4send(g), 'e', '{}', '', now() - interval '30 days' "
        "FROM generate_series(1, 20) g"
    )
    with Engine(make_settings(schema, retention_batch=7, history_keep_runs=20)) as small:
        report = small.prune()
    assert report.deleted[Retained.RUNS] == 30
    assert report.deleted[Retained.HTTP_CACHE] == 20
    # 90 runs walked 7 at a time: 13 statements (the 13th finds the last 6 and ends the walk),
    # the cache entries in 3 (7, 7, 6), then one each for seen keys, workers, rate budgets,
    # jobs and ingestions, each finding less than a batch.
    assert report.statements == 13 + 3 + 5
    kept = admin.execute(
        "SELECT connection_id, count(*) AS n FROM connection_runs GROUP BY 1"
    ).fetchall()
    assert {(r["connection_id"], r["n"]) for r in kept} == {(1, 20), (2, 20), (3, 20)}


def test_an_etag_cache_entry_asked_for_is_marked_used_at_most_once_an_hour(
    engine: Engine, admin: Any
) -> None:
    admin.execute("INSERT INTO workspaces (name) VALUES ('acme')")
    admin.execute("INSERT INTO connections (workspace_id, name, provider) VALUES (1, 'c', 'gh')")
    admin.execute(
        "INSERT INTO http_cache (connection_id, url_hash, etag, headers, body, used_at) VALUES "
        "(1, 'old', 'e', '{}', '', now() - interval '8 days'), "
        "(1, 'recent', 'e', '{}', '', now() - interval '30 minutes')"
    )
    store = RunStore(engine.pool)
    assert store.cached_response(1, b"old") is not None
    assert store.cached_response(1, b"recent") is not None
    unused = {
        r["key"]: r["unused"]
        for r in admin.execute(
            "SELECT convert_from(url_hash, 'UTF8') AS key, now() - used_at AS unused "
            "FROM http_cache"
        ).fetchall()
    }
    # Asked for now, the old entry is used again; the recent one was marked less than an hour
    # ago and is left as it was (no write for every 304).
    assert unused["old"] < timedelta(minutes=1)
    assert timedelta(minutes=29) < unused["recent"] < timedelta(minutes=31)
    assert engine.prune().deleted[Retained.HTTP_CACHE] == 0


def test_keeping_no_runs_deletes_every_old_one(schema: str, engine: Engine, admin: Any) -> None:
    admin.execute("INSERT INTO workspaces (name) VALUES ('acme')")
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider) VALUES (1, 'c', 'memory')"
    )
    add_runs(admin, 1, 5, age="40 days")
    recent = add_runs(admin, 1, 2, age="1 day")
    with Engine(make_settings(schema, history_keep_runs=0, history_days=7)) as engine_7_days:
        assert engine_7_days.prune().deleted[Retained.RUNS] == 5
    assert remaining_runs(admin) == set(recent)


def test_a_run_retried_while_the_pass_deletes_it_is_kept(
    engine: Engine, admin: Any, history: dict[str, Any]
) -> None:
    """The pass read the run as finished; an operator's retry commits before its DELETE reaches
    the row. The DELETE waits for the retry's lock, re-reads the row, finds it queued, and
    keeps it (with its attempts)."""
    target = min(history["doomed"])
    admin.execute("UPDATE connection_runs SET status = 'failed' WHERE id = %s", (target,))
    # Connection 1 has no queued or running run: the retry is allowed.
    with admin.transaction():
        retried = admin.execute(
            QUERIES.retry_run, {"run_id": target, "workspace_id": None, "max_attempts": 3}
        ).fetchone()
        assert retried is not None and retried["status"] == "queued"
        outcome: dict[str, Any] = {}
        pruning = threading.Thread(target=lambda: outcome.update(report=engine.prune()))
        pruning.start()
        wait_until_blocked(engine.settings.schema_name)
    pruning.join(60)
    assert outcome["report"].deleted[Retained.RUNS] == len(history["doomed"]) - 1
    assert target in remaining_runs(admin)
    assert len(ids(admin, f"SELECT id FROM run_attempts WHERE run_id = {target}")) == 2


def add_jobs(admin: Any, queue: str, status: str, count: int, *, age: str | None) -> list[int]:
    """``count`` jobs of ``queue`` that finished ``age`` ago (None: not finished), with two
    attempts each."""
    rows = admin.execute(
        "INSERT INTO jobs (queue, origin_queue, payload, status, attempts, run_after, "
        "created_at, finished_at) SELECT %(queue)s, %(queue)s, '{}', %(status)s, 2, "
        "now() - interval '60 days', now() - interval '60 days', now() - %(age)s::interval "
        "FROM generate_series(1, %(count)s) RETURNING id",
        {"queue": queue, "status": status, "age": age, "count": count},
    ).fetchall()
    job_ids = [r["id"] for r in rows]
    admin.execute(
        "INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome) "
        "SELECT id, a, %s, now() - interval '60 days', now() - interval '60 days', 'failed' "
        "FROM unnest(%s::bigint[]) id, generate_series(1, 2) a",
        (queue, job_ids),
    )
    return job_ids


def add_ingestion(
    admin: Any, status: str, *, age: str | None, kind: str = "document", archive: int | None = None
) -> int:
    """A local file's ingestion that finished ``age`` ago (None: not finished)."""
    row = admin.execute(
        "INSERT INTO ingestions (workspace_id, kind, status, source, local_path, member_path, "
        "archive_id, source_hash, max_attempts, queued_at, finished_at) VALUES (1, %(kind)s, "
        "%(status)s, 'local', '/data/' || gen_random_uuid(), '', %(archive)s, '\\x00', 3, "
        "now() - interval '60 days', now() - %(age)s::interval) RETURNING id",
        {"kind": kind, "status": status, "archive": archive, "age": age},
    ).fetchone()
    return int(row["id"])


@pytest.fixture
def jobs_and_ingestions(engine: Engine, admin: Any) -> dict[str, set[int]]:
    """Application jobs and ingestions on either side of their rules."""
    admin.execute("INSERT INTO workspaces (name) VALUES ('acme')")
    admin.execute(
        "INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire, "
        "retention) VALUES ('app.dead', 'standard', 0, 1, 1, 60, 30 * 86400), "
        "('app.work', 'standard', 2, 1, 10, 60, 86400)"
    )
    # app.work keeps finished jobs one day; its dead letters are in app.dead, kept 30 days.
    doomed = {
        *add_jobs(admin, "app.work", "completed", 3, age="2 days"),
        *add_jobs(admin, "app.work", "cancelled", 1, age="2 days"),
        *add_jobs(admin, "app.dead", "dead", 2, age="40 days"),
    }
    kept = {
        *add_jobs(admin, "app.work", "completed", 1, age="1 hour"),
        *add_jobs(admin, "app.dead", "dead", 1, age="2 days"),
        # Not finished, however old (an older attempt's finished_at is no finish).
        *add_jobs(admin, "app.work", "queued", 1, age=None),
        *add_jobs(admin, "app.work", "retrying", 1, age="50 days"),
        *add_jobs(admin, "app.work", "active", 1, age="50 days"),
    }
    # Ingestions keep history_days (30).
    gone = {
        add_ingestion(admin, status, age="40 days") for status in ("ready", "skipped", "failed")
    }
    gone.add(add_ingestion(admin, "cancelled", age="31 days"))
    expanded = add_ingestion(admin, "ready", age="40 days", kind="archive")
    gone |= {expanded, add_ingestion(admin, "ready", age="40 days", archive=expanded)}
    # An archive whose member is still queued stays, with that member.
    expanding = add_ingestion(admin, "ready", age="40 days", kind="archive")
    staying = {
        expanding,
        add_ingestion(admin, "queued", age=None, archive=expanding),
        add_ingestion(admin, "ready", age="1 day"),
        add_ingestion(admin, "running", age=None),
    }
    return {
        "jobs_doomed": doomed,
        "jobs_kept": kept,
        "ingestions_doomed": gone,
        "ingestions_kept": staying,
    }


def test_finished_jobs_and_ingestions_go_by_their_rules(
    engine: Engine, admin: Any, jobs_and_ingestions: dict[str, set[int]]
) -> None:
    h = jobs_and_ingestions
    dry = engine.prune(dry_run=True)
    assert ids(admin, "SELECT id FROM jobs") == h["jobs_doomed"] | h["jobs_kept"]
    assert ids(admin, "SELECT id FROM ingestions") == h["ingestions_doomed"] | h["ingestions_kept"]

    report = engine.prune()
    for counted in (dry, report):
        assert counted.deleted[Retained.JOBS] == len(h["jobs_doomed"])
        assert counted.deleted[Retained.JOB_ATTEMPTS] == 2 * len(h["jobs_doomed"])
        assert counted.deleted[Retained.INGESTIONS] == len(h["ingestions_doomed"])
    assert ids(admin, "SELECT id FROM jobs") == h["jobs_kept"]
    assert ids(admin, "SELECT job_id FROM job_attempts") == h["jobs_kept"]  # with their jobs
    assert ids(admin, "SELECT id FROM ingestions") == h["ingestions_kept"]
    assert engine.prune().deleted[Retained.JOBS] == 0


def test_jobs_and_ingestions_go_in_bounded_batches(
    schema: str, engine: Engine, admin: Any, jobs_and_ingestions: dict[str, set[int]]
) -> None:
    with Engine(make_settings(schema, retention_batch=2)) as small:
        report = small.prune()
    h = jobs_and_ingestions
    assert report.deleted[Retained.JOBS] == len(h["jobs_doomed"]) == 6
    assert report.deleted[Retained.INGESTIONS] == len(h["ingestions_doomed"]) == 6
    # Per kind, batches of 2 until one finds less than 2: 4 statements for 6 rows (the last
    # finds none), 1 each for the empty kinds; finished runs: one walk of none.
    assert report.statements == 1 + 1 + 1 + 1 + 1 + 4 + 4
    assert ids(admin, "SELECT id FROM ingestions") == h["ingestions_kept"]


def test_a_scoped_engine_cannot_prune(engine: Engine) -> None:
    ws = engine.create_workspace("acme")
    with pytest.raises(Exception, match="cannot prune"):
        engine.scoped(ws.id).prune()


# -- the command -------------------------------------------------------------------------------


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], schema: str, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("DATABASE_URL", DATABASE_URL)
    monkeypatch.setenv("CONNECTOR_SYNC_SCHEMA", schema)
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_prune_says_what_it_deleted_or_would_at_80_columns(
    schema: str,
    engine: Engine,
    admin: Any,
    history: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(monkeypatch, capsys, schema, "prune", "--dry-run")
    assert code == 0, err
    assert all(len(line) <= 80 for line in out.splitlines()), out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert lines["runs"].split()[1] == str(len(history["doomed"]))
    assert lines["workers"].split()[1] == "2"
    assert lines["tombstones"].split()[1] == "-"
    assert lines["jobs"].split()[1] == "0" and lines["ingestions"].split()[1] == "0"
    assert "would delete" in out
    assert remaining_runs(admin) == history["doomed"] | history["kept"]

    code, out, err = run_cli(monkeypatch, capsys, schema, "prune", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["dry_run"] is False
    assert document["deleted"]["runs"] == len(history["doomed"])
    assert document["deleted"]["attempts"] == 2 * len(history["doomed"])
    assert document["rules"]["history_days"] == 30
    assert remaining_runs(admin) == history["kept"]
