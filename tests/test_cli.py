"""The command line, driven as a subprocess (the installed ``connector-sync`` script) against
the real test database, each test in its own schema: every command's happy path, ``--json``
parsed, and every user mistake giving exactly one line on stderr and exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import ValidationError

import connectors
from connectors.simulated.server import Simulation, start_server
from sync.base.durations import parse_duration
from sync.base.settings import Settings
from sync.catalog import describe_provider
from sync.cli.commands import describe_progress
from sync.cli.common import parse_json_object
from sync.cli.console import format_duration
from sync.models import Run
from tests.conftest import DATABASE_URL

SCRIPT = Path(sys.executable).parent / "connector-sync"
SECRET = "s3cr3t-token-never-printed"


def cli(
    schema: str, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "DATABASE_URL": DATABASE_URL,
        "CONNECTOR_SYNC_SCHEMA": schema,
        "COLUMNS": "200",
        **(env or {}),
    }
    return subprocess.run(
        [str(SCRIPT), *args],
        env=environment,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr mentioning each needle."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def simulated() -> Iterator[tuple[str, Simulation]]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=30, seed=3, token=SECRET)
    url, stop = start_server(simulation)
    yield url, simulation
    stop()


@pytest.fixture
def migrated(schema: str) -> str:
    ok(cli(schema, "migrate"))
    return schema


# -- happy paths --------------------------------------------------------------------------------


@pytest.mark.slow
def test_migrate_says_what_it_applied_then_that_it_is_up_to_date(schema: str) -> None:
    first = as_json(cli(schema, "migrate", "--json"))
    assert first["schema"] == schema
    assert first["applied"][0].startswith("0001_")
    again = ok(cli(schema, "migrate"))
    assert f"schema {schema} is up to date" in again.stdout
    # Which database, in one line on stderr, password hidden.
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("database: postgresql://"), lines
    assert lines[0].endswith(f"(DATABASE_URL), schema {schema}")


@pytest.mark.slow
def test_a_day_in_the_life(
    migrated: str, simulated: tuple[str, Simulation], tmp_path: Path
) -> None:
    schema = migrated
    url, simulation = simulated

    ws = as_json(cli(schema, "workspaces", "create", "acme-inc", "--json"))
    assert ws["name"] == "acme-inc"
    assert [w["name"] for w in as_json(cli(schema, "workspaces", "list", "--json"))] == ["acme-inc"]
    assert "acme-inc" in ok(cli(schema, "workspaces", "list")).stdout

    # Config inline, credentials from a file and from stdin; schedules as durations.
    config = json.dumps({"base_url": url, "tenant": "acme", "page_size": 7})
    creds_file = tmp_path / "creds.json"
    creds_file.write_text(json.dumps({"token": SECRET}))
    tracker = as_json(
        cli(
            schema,
            "connections",
            "create",
            "--workspace",
            "acme-inc",
            "--name",
            "tracker",
            "--provider",
            "simulated",
            "--config",
            config,
            "--credentials",
            f"@{creds_file}",
            "--every",
            "1h30m",
            "--json",
        )
    )
    assert tracker["provider"] == "simulated" and tracker["has_credentials"] is True
    assert tracker["schedule_every"] == 5400.0
    crm_result = ok(
        cli(
            schema,
            "connections",
            "create",
            "-w",
            str(ws["id"]),
            "-n",
            "crm",
            "-p",
            "simulated_crm",
            "--config",
            config,
            "--credentials",
            "@-",
            stdin=json.dumps({"token": SECRET}),
        )
    )
    assert "crm" in crm_result.stdout
    listed = as_json(cli(schema, "connections", "list", "--workspace", "acme-inc", "--json"))
    assert [c["name"] for c in listed] == ["tracker", "crm"]
    crm_id = listed[1]["id"]
    human = ok(cli(schema, "connections", "list")).stdout
    assert "tracker" in human and "simulated_crm" in human and "1h30m" in human

    paused = ok(cli(schema, "connections", "pause", str(crm_id)))
    assert "paused" in paused.stdout
    one_line_error(cli(schema, "sync", str(crm_id)), "paused", "resume")
    ok(cli(schema, "connections", "resume", str(crm_id)))

    # Queue a sync, run one worker poll, read the run back.
    queued = as_json(cli(schema, "sync", str(tracker["id"]), "--json"))
    assert queued["status"] == "queued"
    again = ok(cli(schema, "sync", str(tracker["id"])))
    assert f"run #{queued['id']} already queued" in again.stdout or "queued" in again.stdout
    worker = ok(cli(schema, "worker", "--once", "--id", "cli-once"))
    assert "worker cli-once started" in worker.stderr
    run = as_json(cli(schema, "runs", "show", str(queued["id"]), "--json"))
    assert run["status"] == "succeeded"
    assert run["attempts"][0]["worker_id"] == "cli-once"
    assert run["attempts"][0]["outcome"] == "succeeded"
    issues = len(simulation.tenant("acme").rows("issues"))
    assert run["results"]["issues"]["upserted"] == issues
    shown = ok(cli(schema, "runs", "show", str(queued["id"]))).stdout
    assert "attempts" in shown and "issues" in shown and "cli-once" in shown
    listed_runs = as_json(cli(schema, "runs", "list", "--connection", str(tracker["id"]), "--json"))
    assert [r["id"] for r in listed_runs] == [queued["id"]]
    assert as_json(cli(schema, "runs", "list", "--status", "failed", "--json")) == []
    shown_conn = as_json(cli(schema, "connections", "show", str(tracker["id"]), "--json"))
    assert shown_conn["recent_runs"][0]["id"] == queued["id"]
    assert "recent runs" in ok(cli(schema, "connections", "show", str(tracker["id"]))).stdout

    workers = as_json(cli(schema, "workers", "--json"))
    assert [(w["id"], w["state"]) for w in workers] == [("cli-once", "stopped")]

    # `sync --wait` follows a run to its end while a worker process serves it.
    simulation.tenant("acme").advance()
    background = subprocess.Popen(
        [str(SCRIPT), "worker", "--id", "cli-bg"],
        env={**os.environ, "DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        waited = ok(cli(schema, "sync", str(tracker["id"]), "--wait"))
        assert "succeeded" in waited.stdout and "tombstoned" in waited.stdout
        final = as_json(cli(schema, "sync", str(crm_id), "--wait", "--json"))
        assert final["status"] == "succeeded"
        states = {w["id"]: w["state"] for w in as_json(cli(schema, "workers", "--json"))}
        assert states["cli-bg"] == "alive"
        assert "alive" in ok(cli(schema, "workers")).stdout
    finally:
        background.send_signal(signal.SIGTERM)
        assert background.wait(timeout=30) == 0

    # Cancel a queued run; delete a connection (its purge is queued).
    run_id = as_json(cli(schema, "sync", str(crm_id), "--json"))["id"]
    cancelled = as_json(cli(schema, "runs", "cancel", str(run_id), "--json"))
    assert cancelled["status"] == "cancelled"
    one_line_error(cli(schema, "runs", "cancel", str(run_id)), "cancelled")
    purge = as_json(cli(schema, "connections", "delete", str(crm_id), "--json"))
    assert purge["kind"] == "purge" and purge["status"] == "queued"

    # Nothing printed anywhere ever contains the credentials.
    everything = [
        cli(schema, "connections", "show", str(tracker["id"]), "--json"),
        cli(schema, "connections", "list"),
        cli(schema, "runs", "list", "--json"),
        cli(schema, "runs", "show", str(queued["id"])),
    ]
    for result in everything:
        assert SECRET not in result.stdout + result.stderr


@pytest.mark.slow
def test_sync_wait_exits_nonzero_when_the_run_fails_and_retry_requeues_it(
    migrated: str, simulated: tuple[str, Simulation]
) -> None:
    schema = migrated
    url, _ = simulated
    ok(cli(schema, "workspaces", "create", "w"))
    # A tenant the provider does not know: 404, a permanent failure of every table.
    conn = as_json(
        cli(
            schema,
            "connections",
            "create",
            "-w",
            "w",
            "-n",
            "ghost",
            "-p",
            "simulated",
            "--config",
            json.dumps({"base_url": url, "tenant": "ghost"}),
            "--credentials",
            '{"token": "t0k3n-ghost"}',
            "--json",
        )
    )
    background = subprocess.Popen(
        [str(SCRIPT), "worker", "--id", "cli-fail"],
        env={**os.environ, "DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        waited = cli(schema, "sync", str(conn["id"]), "--wait")
    finally:
        background.send_signal(signal.SIGTERM)
        background.wait(timeout=30)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "failed" in waited.stdout and "404" in waited.stdout
    run = as_json(cli(schema, "runs", "list", "--status", "failed", "--json"))[0]
    retried = as_json(cli(schema, "runs", "retry", str(run["id"]), "--json"))
    assert retried["status"] == "queued" and retried["id"] == run["id"]
    one_line_error(cli(schema, "runs", "retry", str(run["id"])), "only a failed or cancelled run")


@pytest.mark.slow
def test_providers_lists_tables_and_config_and_credential_fields(schema: str) -> None:
    found = {p["provider"]: p for p in as_json(cli(schema, "providers", "--json"))}
    assert found["simulated"]["tables"] == [
        {"name": "projects", "mode": "full", "primary_key": "id", "deletions": "next sync"},
        {"name": "issues", "mode": "full", "primary_key": "id", "deletions": "next sync"},
    ]
    assert {
        "name": "deals",
        "mode": "incremental",
        "primary_key": "id",
        "deletions": "delta feed",
    } in found["simulated_crm"]["tables"]
    config = {f["name"]: f for f in found["simulated"]["config"]}
    assert config["base_url"]["required"] is True and config["base_url"]["type"] == "str"
    assert config["page_size"] == {
        "name": "page_size",
        "type": "int",
        "required": False,
        "default": 25,
    }
    credentials = {f["name"]: f for f in found["procore"]["credentials"]}
    assert credentials["refresh_token"]["required"] is True
    assert credentials["access_token"]["required"] is False
    # A connector that declares no credentials model accepts any credentials.
    assert describe_provider("memory", connectors.get("memory"))["credentials"] is None
    human = ok(cli(schema, "providers")).stdout
    assert "simulated_crm" in human
    assert "page_size (optional)" in human and "client_secret" in human
    assert "deals (incremental; deletions: delta feed)" in human


@pytest.mark.slow
def test_providers_say_how_late_each_reference_tables_deletions_are_found(schema: str) -> None:
    def latencies(env: dict[str, str] | None = None) -> dict[str, str]:
        found = as_json(cli(schema, "providers", "--json", env=env))
        return {
            f"{p['provider']}.{t['name']}": t["deletions"]
            for p in found
            if p["provider"] in ("github", "procore", "msgraph_drive")
            for t in p["tables"]
        }

    # By default every deletion is found by the next sync, or reported by a delta feed.
    assert latencies() == {
        "github.issues": "next sync",
        "github.pull_requests": "next sync",
        "procore.companies": "next sync",
        "procore.projects": "next sync",
        "procore.rfis": "next sync",
        "msgraph_drive.drive_items": "delta feed",
    }
    # An operator's opt-in that trades deletion latency for requests says what it costs.
    spaced = latencies({"CONNECTOR_SYNC_COMPLETE_EVERY": "github.issues=12h,procore.rfis=1d12h"})
    assert spaced["github.issues"] == "within 12h"
    assert spaced["procore.rfis"] == "within 1d12h"
    assert spaced["github.pull_requests"] == "next sync"  # always listed whole


@pytest.mark.slow
def test_grant_gives_a_role_data_rights(migrated: str) -> None:
    role = f"r_{migrated}"
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role}")
    try:
        assert role in ok(cli(migrated, "grant", role)).stdout
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            row = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'INSERT'), "
                "has_schema_privilege(%s, %s, 'CREATE')",
                (role, f"{migrated}.connection_runs", role, migrated),
            ).fetchone()
        assert row == (True, False)
        one_line_error(cli(migrated, "grant", "no_such_role_x"), "does not exist")
    finally:
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


# -- user mistakes: one line on stderr, exit 2 ----------------------------------------------------


@pytest.fixture(scope="module")
def shared_schema() -> Iterator[str]:
    """One migrated schema with a workspace and a connection, for the mistakes below."""
    name = f"t_cli_{os.getpid()}"
    ok(cli(name, "migrate"))
    ok(cli(name, "workspaces", "create", "w"))
    ok(
        cli(
            name,
            "connections",
            "create",
            "-w",
            "w",
            "-n",
            "c",
            "-p",
            "simulated",
            "--config",
            '{"base_url": "http://127.0.0.1:9", "tenant": "x"}',
            "--credentials",
            GOOD_CREDENTIALS,
        )
    )
    yield name
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


CREATE = ["connections", "create", "-w", "w", "-n", "n2", "-p", "simulated"]
GOOD_CONFIG = '{"base_url": "http://127.0.0.1:9", "tenant": "x"}'
GOOD_CREDENTIALS = '{"token": "t0k3n-shared"}'

MISTAKES = {
    "unknown connection (show)": (["connections", "show", "999"], ["no connection 999"]),
    "unknown connection (sync)": (["sync", "999"], ["no connection 999"]),
    "unknown connection (pause)": (["connections", "pause", "999"], ["no connection 999"]),
    "unknown connection (delete)": (["connections", "delete", "999"], ["no connection 999"]),
    "unknown run (show)": (["runs", "show", "999"], ["no run 999"]),
    "unknown run (cancel)": (["runs", "cancel", "999"], ["no run 999"]),
    "unknown run (retry)": (["runs", "retry", "999"], ["no run 999"]),
    "unknown workspace (create)": (
        ["connections", "create", "-w", "nope", "-n", "x", "-p", "simulated"],
        ["no workspace named 'nope'"],
    ),
    "unknown workspace (list)": (["runs", "list", "--workspace", "nope"], ["no workspace"]),
    "duplicate workspace": (["workspaces", "create", "w"], ["already exists"]),
    "duplicate connection": (
        [*CREATE[:5], "c", *CREATE[6:], "--config", GOOD_CONFIG, "--credentials", GOOD_CREDENTIALS],
        ["already has a connection"],
    ),
    "bad config JSON": ([*CREATE, "--config", "{bad"], ["--config is not valid JSON"]),
    "config not an object": ([*CREATE, "--config", "[1, 2]"], ["must be a JSON object"]),
    "config file missing": ([*CREATE, "--config", "@/no/such/file.json"], ["cannot read"]),
    "config invalid for provider": (
        [*CREATE, "--config", '{"tenant": "x"}'],
        ["config is invalid", "base_url"],
    ),
    "bad credentials JSON": (
        [*CREATE, "--config", GOOD_CONFIG, "--credentials", '{"token": "abc'],
        ["--credentials is not valid JSON"],
    ),
    "unknown provider": (
        ["connections", "create", "-w", "w", "-n", "x", "-p", "nosuch"],
        ["no connector is registered for provider 'nosuch'"],
    ),
    "bad duration": ([*CREATE, "--config", GOOD_CONFIG, "--every", "soon"], ["not a duration"]),
    "bad run status": (["runs", "list", "--status", "done"], ["--status must be one of"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MISTAKES), ids=list(MISTAKES))
def test_user_mistakes_are_one_line_and_exit_2(shared_schema: str, case: str) -> None:
    args, needles = MISTAKES[case]
    line = one_line_error(cli(shared_schema, *args), *needles)
    if "credentials" in case:
        assert "abc" not in line


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("postgresql://postgres:pw@127.0.0.1:1/test", ["cannot connect", "127.0.0.1:1"]),
        ("not a database url", ["not a valid Postgres URL"]),
    ],
    ids=["unreachable", "wrong-url"],
)
@pytest.mark.slow
def test_database_mistakes(schema: str, url: str, needles: list[str]) -> None:
    for args in (["workspaces", "list"], ["worker", "--once"], ["migrate"]):
        line = one_line_error(cli(schema, *args, env={"DATABASE_URL": url}), *needles)
        assert ":pw@" not in line  # the password is never shown


@pytest.mark.slow
def test_schema_behind_names_the_command_to_run(schema: str) -> None:
    for args in (["workspaces", "list"], ["worker", "--once"], ["runs", "list", "--json"]):
        one_line_error(cli(schema, *args), "connector-sync migrate")


@pytest.mark.slow
def test_invalid_setting(schema: str) -> None:
    one_line_error(
        cli(schema, "workspaces", "list", env={"CONNECTOR_SYNC_SCHEMA": "Not-A-Schema"}),
        "invalid setting",
    )


# -- pure helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15m", 900), ("1h", 3600), ("1h30m", 5400), ("45s", 45), ("2d", 172800), ("90", 90)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "15x", "0s", "1h and a bit", "-5m"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_complete_every_is_parsed_per_provider_and_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONNECTOR_SYNC_COMPLETE_EVERY", "github.issues=12h, procore.rfis=2d")
    settings = Settings()
    assert settings.complete_every == {
        "github.issues": timedelta(hours=12),
        "procore.rfis": timedelta(days=2),
    }
    assert settings.complete_every_of("github", "issues") == timedelta(hours=12)
    assert settings.complete_every_of("github", "pull_requests") is None  # every sync


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("github.issues", "is not PROVIDER.TABLE=DURATION"),
        ("issues=12h", "is not PROVIDER.TABLE=DURATION"),
        ("github.issues=soon", "github.issues: 'soon' is not a duration"),
        ("github.issues=0s", "github.issues: '0s' is not a positive duration"),
        ("github.issues=1h,github.issues=2h", "'github.issues' is given twice"),
    ],
)
def test_a_bad_complete_every_is_one_line(
    monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    monkeypatch.setenv("CONNECTOR_SYNC_COMPLETE_EVERY", text)
    with pytest.raises(ValidationError) as caught:
        Settings()
    (error,) = caught.value.errors()
    assert error["loc"] == ("complete_every",)
    assert says in error["msg"] and "\n" not in error["msg"]


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, 3.25, 65, 5400, 200000)] == [
        "-",
        "3.2s",
        "1m05s",
        "1h30m",
        "2d07h",
    ]


def test_parse_json_object_never_quotes_secrets(tmp_path: Path) -> None:
    assert parse_json_object('{"a": 1}', "--config") == {"a": 1}
    path = tmp_path / "c.json"
    path.write_text('{"b": 2}')
    assert parse_json_object(f"@{path}", "--config") == {"b": 2}
    with pytest.raises(ValueError) as info:
        parse_json_object('{"token": "hunter22', "--credentials", secret=True)
    assert "hunter22" not in str(info.value)


def _run(**fields: Any) -> Run:
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": 1,
        "connection_id": 1,
        "workspace_id": 1,
        "provider": "simulated",
        "kind": "sync",
        "status": "queued",
        "trigger": "manual",
        "attempts": 0,
        "max_attempts": 3,
        "queued_at": now,
        "started_at": None,
        "finished_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "worker_id": None,
        "cancel_requested_at": None,
        "results": {},
        "error": None,
        "processed_units": 0,
        "total_units": None,
    }
    values.update(fields)
    return Run.from_row(values)


def test_describe_progress() -> None:
    now = datetime.now(UTC)
    waiting = _run(
        attempts=1,
        queued_at=now + timedelta(seconds=3),
        error={"kind": "rate_limited", "message": "429"},
    )
    assert describe_progress(waiting, workers_alive=1, now=now) == (
        "retrying in 3s (attempt 2 of 3) after rate_limited: 429"
    )
    assert "start one with `connector-sync worker`" in describe_progress(
        _run(), workers_alive=0, now=now
    )
    running = _run(status="running", attempts=2, cancel_requested_at=now)
    assert describe_progress(running, workers_alive=1, now=now) == (
        "running attempt 2 of 3, cancel requested"
    )


def test_sync_wait_without_a_terminal_prints_a_wait_once_not_every_second(
    engine: Any, admin: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from sync.cli.commands import follow_run
    from tests.fakes import DATASETS, Dataset

    DATASETS["plain-wait"] = Dataset(tables={"items": []})
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": "plain-wait"})
    run = engine.sync(conn.id)
    # The run's first attempt was rate limited: it is queued again for 30 seconds from now.
    admin.execute(
        "UPDATE connection_runs SET attempts = 1, queued_at = now() + interval '30 seconds', "
        """error = '{"kind": "rate_limited", "message": "429 Too Many Requests"}' """
        "WHERE id = %s",
        (run.id,),
    )
    start = datetime.now(UTC)
    ticks: list[float] = []

    def sleep(seconds: float) -> None:  # the clock moves one second per poll
        ticks.append(seconds)
        if len(ticks) == 20:
            engine.cancel_run(run.id)

    follow_run(
        engine,
        engine.run(run.id),
        live=True,
        interval=1.0,
        clock=lambda: start + timedelta(seconds=len(ticks)),
        sleep=sleep,
    )
    progress = [line for line in capsys.readouterr().out.splitlines() if ": retrying" in line]
    assert len(ticks) == 20  # twenty polls of the waiting run...
    assert len(progress) == 1, progress  # ...and one line saying when it retries
    assert "retrying at " in progress[0] and "(attempt 2 of 3)" in progress[0], progress
