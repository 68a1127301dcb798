"""What a second new-user pass over the command line found, each shown through the command line
against the test database (and the embedded Postgres, through the ``backend`` fixture): field
names cut at their underscores, a run's "queued" time that was its retry time, help wrapped
raggedly, a footer that named the wrong database, an empty home that meant the current
directory, a warning that ignored the width, counts that left the attempts table, records in
text order, a socket connection called localhost, a key rotation that could leave the
credentials readable nowhere, and a hand-back's counts."""

from __future__ import annotations

import itertools
import json
import logging
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from cryptography.fernet import Fernet
from psycopg.conninfo import conninfo_to_dict
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from connectors import RetryableError
from connectors.simulated.server import Simulation, start_server
from sync.base.database_url import describe
from sync.cli import app, main
from sync.cli.commands import print_results
from sync.cli.common import WrappedWarnings, runs_table
from sync.cli.console import when
from sync.testing import make_run_due
from tests.cli_backends import Backend, Cli
from tests.conftest import DATABASE_URL
from tests.test_cli_defects import command_paths, widest
from tests.test_sync_flow import items, new_dataset

TOKEN = "t0k3n-audit"


@pytest.fixture
def simulated() -> Iterator[tuple[str, Simulation]]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=300, seed=7, token=TOKEN)
    url, stop = start_server(simulation)
    yield url, simulation
    stop()


def run_main(
    capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:  # the exit code and stdout of a command, in this process
    # On the test database: without DATABASE_URL the command would start the embedded
    # Postgres in the user's own data directory.
    with pytest.MonkeyPatch.context() as env, pytest.raises(SystemExit) as exited:
        env.setenv("DATABASE_URL", DATABASE_URL)
        main(list(args))
    code = exited.value.code
    return (code if isinstance(code, int) else 0), capsys.readouterr().out


# -- field names wrap between fields, never inside one ------------------------------------------


@pytest.mark.parametrize("width", (60, 80, 120))
def test_provider_fields_wrap_between_names_never_inside_one(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, described = run_main(capsys, "providers", "--json")
    names = {
        name
        for provider in json.loads(described)
        for name in (
            provider["provider"],
            *(t["name"] for t in provider["tables"]),
            *(f["name"] for f in provider["config"] or ()),
            *(f["name"] for f in provider["credentials"] or ()),
        )
    }
    assert {"base_url", "client_secret", "expires_at", "pull_requests"} <= names
    monkeypatch.setenv("COLUMNS", str(width))
    code, out = run_main(capsys, "providers")
    assert code == 0 and widest(out) <= width, out
    words = {w.strip(",()") for w in out.split()}
    # Every name is whole on one line: `base_` / `url` would leave both halves as words.
    assert names <= words, sorted(names - words)
    assert not [w for w in words if w.endswith("_") or w.startswith("_")], out


# -- runs show: when a run was first queued, and when its retry is due ----------------------------


@pytest.fixture
def retried(backend: Backend) -> dict[str, Any]:
    """A run whose first attempt, by a worker with a long id, failed and was queued again for a
    retry some seconds later."""
    key, data = new_dataset(items=items(1, 2, 3))
    data.failures["items"] = (2, RetryableError("the upstream cache was cold"))
    with backend.engine() as engine:
        ws = engine.create_workspace("w")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        run = engine.sync(conn.id)
        worker = engine.worker(worker_id="audit-worker-with-a-rather-long-identifier", listen=False)
        worker.poll()
        worker.close()
        again = engine.run(run.id)
    assert (again.status, again.attempts) == ("queued", 1)
    return {"run": run.id, "dataset": data}


def test_runs_show_says_when_a_run_was_first_queued_and_when_its_retry_is_due(
    cli: Cli, backend: Backend, retried: dict[str, Any]
) -> None:
    run = cli("runs", "show", str(retried["run"]), "--json").json()
    first, due = (datetime.fromisoformat(run[k]) for k in ("first_queued_at", "queued_at"))
    assert first < datetime.fromisoformat(run["attempts"][0]["started_at"]) < due

    shown = cli("runs", "show", str(retried["run"])).ok().out
    assert re.search(rf"^queued\s+{re.escape(when(first))}\s*$", shown, re.M), shown
    assert re.search(rf"^retry due\s+{re.escape(when(due))}\s*$", shown, re.M), shown
    listed = cli("runs", "list").ok().out
    assert when(first, seconds=False) in listed, listed

    # Once it has run, the first time stays, and no retry is due.
    del retried["dataset"].failures["items"]
    with backend.engine() as engine:
        make_run_due(engine, retried["run"])
        worker = engine.worker(listen=False)
        worker.poll()
        worker.close()
    shown = cli("runs", "show", str(retried["run"])).ok().out
    assert "succeeded" in shown and "retry due" not in shown, shown
    assert re.search(rf"^queued\s+{re.escape(when(first))}\s*$", shown, re.M), shown


def test_a_run_without_a_first_queued_time_gets_its_earliest_recorded_time(
    cli: Cli, backend: Backend, retried: dict[str, Any]
) -> None:
    with backend.engine() as engine, engine.pool.connection() as conn:
        # The column may be NULL; the run was retried, so its queued_at is later than its first
        # start.
        conn.execute("UPDATE connection_runs SET first_queued_at = NULL")
    run = cli("runs", "show", str(retried["run"]), "--json").json()
    first, started, due = (
        datetime.fromisoformat(t)
        for t in (run["first_queued_at"], run["started_at"], run["queued_at"])
    )
    assert first == started < due, run


# -- the attempts table keeps its counts at 60 and 80 columns -------------------------------------


@pytest.mark.parametrize("width", (60, 80))
def test_the_attempts_table_keeps_its_counts_at_any_width(
    cli: Cli, retried: dict[str, Any], width: int
) -> None:
    shown = cli("runs", "show", str(retried["run"]), columns=width).ok().out
    assert widest(shown) <= width, shown
    lines = shown.splitlines()
    header = lines.index(next(line for line in lines if line.lstrip().startswith("#")))
    assert lines[header].split()[:2] == ["#", "outcome"], shown
    assert lines[header].split()[-3:] == ["upserted", "unchanged", "tombstoned"], shown
    # The row of attempt 1 ends with its three counts (its rows were not committed).
    assert lines[header + 2].split()[:2] == ["1", "retry"], shown
    assert lines[header + 2].split()[-3:] == ["0", "0", "0"], shown


# -- help paragraphs wrap at the console's width ---------------------------------------------------


def ragged(text: str) -> list[tuple[str, str]]:
    """Pairs of lines of a help's prose (its paragraphs, and the descriptions in its list of
    commands) where the first was broken early: the next line's first word would have fit on
    it. The console wraps greedily, so only a line break written in the help does that."""
    found = []
    lines = text.splitlines()
    panel, start = "", 0
    for line, following in itertools.pairwise(lines):
        if line.startswith("╭"):
            panel = line
            continue
        if panel and "Commands" in panel and line.startswith("│ ") and line[2] != " ":
            start = len(line) - len(line[2:].split("  ", 1)[1].lstrip())  # the description
        if panel and not line.startswith("│"):
            panel = ""
        if panel and "Commands" not in panel:
            continue  # options and arguments: their helps are single strings
        if panel:
            this, nxt = line[start:].rstrip("│ "), following[start:].rstrip("│ ")
            room = len(line.rstrip("│")) - 1 - start
            continues = following.startswith("│ ") and not following[2:start].strip()
        else:
            this, nxt = line.strip(), following.strip()
            room = len(line) - 2  # one space on each side
            continues = bool(nxt) and not line.strip().startswith("Usage:")
        if this and continues and nxt and cell_len(this) + 1 + cell_len(nxt.split()[0]) <= room:
            found.append((this, nxt))
    return found


def test_every_help_wraps_its_paragraphs_at_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for path in command_paths(typer.main.get_command(app)):
        code, help_text = run_main(capsys, *path, "--help")
        assert code == 0 and "Usage: connector-sync" in help_text, path
        assert ragged(help_text) == [], (path, help_text)


def test_the_ragged_check_sees_a_hard_line_break() -> None:
    text = (
        " A purge run removes each connection's records (behind a sync still running);   \n"
        " the name is                                                                    \n"
        " free again at once.                                                            \n"
    )
    assert ragged(text) == [("the name is", "free again at once.")]


# -- the footer of `db status|stop` names the database commands use --------------------------------


def test_db_status_and_stop_name_the_database_commands_use(
    cli: Cli, backend: Backend, tmp_path: Path
) -> None:
    if backend.name != "database_url":
        pytest.skip("about DATABASE_URL")
    home = str(tmp_path / "home")
    footer = f"database: {describe(DATABASE_URL)} (DATABASE_URL), schema {backend.schema}"
    for command in (("db", "status"), ("db", "stop")):
        result = cli(*command, CONNECTOR_SYNC_HOME=home).ok()
        assert result.err.strip().splitlines() == [footer], result.err
        assert "DATABASE_URL is set, so commands use that database" in result.out, result.out


# -- an empty CONNECTOR_SYNC_HOME is unset ---------------------------------------------------------


def test_an_empty_home_is_the_users_data_directory_not_the_current_one(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "xdg-data"
    status = cli("db", "status", "--json", CONNECTOR_SYNC_HOME="", XDG_DATA_HOME=str(data))
    assert status.json()["data_dir"] == str(data / "connector-sync" / "pgdata")


# -- a warning the engine logs wraps like the rest of the output -----------------------------------


def test_warnings_logged_without_logging_configured_wrap_at_the_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    run_main(capsys, "providers")
    handler = logging.lastResort  # what every command installs: no configured logging sees it
    assert isinstance(handler, WrappedWarnings)
    message = "created a credentials key at /home/someone/.local/share/connector-sync/" + (
        "secret.key; set CONNECTOR_SYNC_SECRET_KEYS on servers so every machine shares one key"
    )
    handler.handle(logging.makeLogRecord({"msg": message, "levelno": 30, "levelname": "WARNING"}))
    err = capsys.readouterr().err
    assert " ".join(err.split()) == f"warning: {message}"
    assert len(err.splitlines()) > 1 and widest(err) <= 80, err


@pytest.mark.slow
def test_the_new_credentials_key_warning_wraps_at_the_width(
    cli: Cli, backend: Backend, request: pytest.FixtureRequest
) -> None:
    if backend.name != "database_url":
        pytest.skip("a home of its own for the key file: the embedded database's is shared")
    # A short path: the warning wraps between words, and a path longer than a line (pytest's
    # temporary directories under xdist are) can only be cut inside itself.
    home = Path(tempfile.mkdtemp(prefix="cs-")) / "home"
    request.addfinalizer(lambda: shutil.rmtree(home.parent, ignore_errors=True))
    env = {"CONNECTOR_SYNC_SECRET_KEYS": None, "CONNECTOR_SYNC_HOME": str(home), "COLUMNS": "80"}
    cli("workspaces", "create", "w").ok()
    proc = cli.script(
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
        '{"token": "t"}',
        **env,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"warning: created a credentials key at {home / 'secret.key'}; set " in " ".join(
        err.split()
    ), err
    warning = [line for line in err.splitlines() if not line.startswith("database: ")]
    assert len(warning) > 1 and widest("\n".join(warning)) <= 80, err


# -- records in the order people count -------------------------------------------------------------


def test_records_list_orders_numeric_ids_as_numbers(cli: Cli, backend: Backend) -> None:
    key, _ = new_dataset(
        items=[*items(10, 2, 101, 1, 11, 100, 9), {"id": "b-2", "title": "b"}, {"id": "a-10"}]
    )
    with backend.engine() as engine:
        ws = engine.create_workspace("w")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        engine.sync(conn.id)
        worker = engine.worker(listen=False)
        worker.poll()
        worker.close()
    expected = ["1", "2", "9", "10", "11", "100", "101", "a-10", "b-2"]
    listed = cli("records", "list", str(conn.id), "--json").json()
    assert [r["external_id"] for r in listed] == expected
    shown = cli("records", "list", str(conn.id)).ok().out
    assert [line.split()[1] for line in shown.splitlines()[2:]] == expected, shown
    first = cli("records", "list", str(conn.id), "--limit", "3", "--json").json()
    assert [r["external_id"] for r in first] == ["1", "2", "9"]


# -- a URL without a host is the local socket ------------------------------------------------------


def test_a_url_without_a_host_is_described_as_the_local_socket(
    cli: Cli, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.name != "database_url":
        pytest.skip("about DATABASE_URL")
    monkeypatch.delenv("PGHOST", raising=False)
    dbname = conninfo_to_dict(DATABASE_URL)["dbname"]  # whatever the test database is called
    socket_url = f"postgresql://postgres@/{dbname}"
    listed = cli("workspaces", "list", DATABASE_URL=socket_url).ok()
    assert listed.err.strip() == (
        f"database: postgresql://postgres@/{dbname} on the local socket (DATABASE_URL), "
        f"schema {backend.schema}"
    ), listed.err
    assert (
        describe("dbname=test user=postgres") == "postgresql://postgres@/test on the local socket"
    )
    monkeypatch.setenv("PGHOST", "db.internal")
    assert describe(socket_url) == f"postgresql://postgres@db.internal:5432/{dbname}"


# -- secrets rotate never leaves the credentials readable nowhere ----------------------------------


def test_secrets_rotate_makes_no_key_and_says_where_the_key_it_used_is(
    cli: Cli, backend: Backend, tmp_path: Path
) -> None:
    if backend.name != "database_url":
        pytest.skip("a home of its own for the key file: the embedded database's is shared")
    home = tmp_path / "home"
    keyless = {"CONNECTOR_SYNC_SECRET_KEYS": None, "CONNECTOR_SYNC_HOME": str(home)}
    # Without a key anywhere, a key made now would encrypt with a key no other machine has.
    cli("secrets", "rotate", **keyless).one_line_error(
        "no key to re-encrypt with", "CONNECTOR_SYNC_SECRET_KEYS is unset"
    )
    assert not (home / "secret.key").exists()

    # One machine's key file: rotating with it changes no key, and says so.
    old = Fernet.generate_key().decode()
    home.mkdir()
    (home / "secret.key").write_text(old)
    cli("workspaces", "create", "w").ok()
    config = '{"base_url": "http://127.0.0.1:9", "tenant": "x"}'
    create = ["connections", "create", "-w", "w", "-p", "simulated", "--config", config]
    cli(*create, "-n", "c", "--credentials", '{"token": "t"}', **keyless).ok()
    same = cli("secrets", "rotate", **keyless).ok()
    assert "the key is unchanged" in " ".join(same.out.split()), same.out

    # Moving to a new key given in the variable: the key file no longer reads the credentials.
    new = Fernet.generate_key().decode()
    rotating = {**keyless, "CONNECTOR_SYNC_SECRET_KEYS": f"{new},{old}"}
    moved = cli("secrets", "rotate", **rotating)
    warning = " ".join(moved.ok().err.split())
    assert (
        f"warning: the credentials are now encrypted with the first key of "
        f"CONNECTOR_SYNC_SECRET_KEYS, which {home / 'secret.key'} does not hold"
    ) in warning, moved.err
    assert new not in moved.out + moved.err and old not in moved.out + moved.err
    # With the key file holding the new key, there is nothing to warn about.
    (home / "secret.key").write_text(new)
    quiet = cli("secrets", "rotate", **rotating).ok()
    assert "warning" not in quiet.err, quiet.err


# -- a handed-back run's counts, for the run and each attempt -------------------------------------


@pytest.mark.slow
def test_a_handed_back_and_resumed_run_counts_each_row_once(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, simulation = simulated
    acme = simulation.tenant("acme")
    rows = len(acme.rows("projects")) + len(acme.rows("issues"))
    assert rows == 330
    cli("workspaces", "create", "acme-inc").ok()
    config = json.dumps({"base_url": url, "tenant": "acme", "page_size": 10})
    conn = cli(
        "connections",
        "create",
        "-w",
        "acme-inc",
        "-n",
        "tracker",
        "-p",
        "simulated",
        "--config",
        config,
        "--credentials",
        json.dumps({"token": TOKEN}),
        "--json",
    ).json()["id"]

    # The worker is stopped (SIGTERM) while it asks for page 12 of the issues: the provider
    # holds that request until the worker has taken the signal.
    reached, stopping = threading.Event(), threading.Event()

    def at_page_12(page: int, size: int) -> None:
        if page == 12:
            reached.set()
            assert stopping.wait(60), "the test never stopped the worker"

    acme.on_change("issues", at_page_12)
    small_batches = {"CONNECTOR_SYNC_BATCH_SIZE": "10"}
    worker = cli.worker("--id", "handing-back", **small_batches)
    try:
        run_id = cli("sync", str(conn), "--json").json()["id"]
        assert reached.wait(60), "the worker never reached page 12"
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait_for("received SIGTERM"), worker.log
    finally:
        stopping.set()
        acme.on_change("issues", None)
    assert worker.proc.wait(timeout=60) == 0, worker.log
    handed = cli("runs", "show", str(run_id), "--json").json()
    assert handed["status"] == "queued", handed
    assert [a["outcome"] for a in handed["attempts"]] == ["handed_back"]

    resumed = cli.script("worker", "--once", "--id", "resuming", **small_batches)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err

    run = cli("runs", "show", str(run_id), "--json").json()
    assert run["status"] == "succeeded" and [a["outcome"] for a in run["attempts"]] == [
        "handed_back",
        "succeeded",
    ], run
    kinds = ("upserted", "unchanged", "tombstoned")

    def total(results: dict[str, Any] | None) -> dict[str, int]:
        return {k: sum(int(t.get(k) or 0) for t in (results or {}).values()) for k in kinds}

    per_run = total(run["results"])
    per_attempt = [total(a["results"]) for a in run["attempts"]]
    # Each row once: the run wrote the connection's 330 rows, and each attempt its own part.
    assert per_run == {"upserted": rows, "unchanged": 0, "tombstoned": 0}, run["results"]
    assert all(a["upserted"] > 0 for a in per_attempt), per_attempt
    assert {k: sum(a[k] for a in per_attempt) for k in kinds} == per_run, per_attempt
    live = cli("records", "list", str(conn), "--limit", "1000", "--json").json()
    assert len(live) == rows

    # The same, as people read it.
    shown = cli("runs", "show", str(run_id), columns=80).ok().out
    assert f"{rows} upserted, 0 unchanged, 0 tombstoned" in shown, shown
    attempt_rows = [line.split() for line in shown.splitlines() if re.match(r"\s*[12]\s", line)]
    assert [(r[0], r[1]) for r in attempt_rows] == [("1", "handed"), ("2", "succeeded")], shown
    assert [[int(n) for n in r[-3:]] for r in attempt_rows] == [
        [a[k] for k in kinds] for a in per_attempt
    ], shown


# -- a cancel is a reason, and one that came after the work was done says so -----------------------


def test_runs_show_says_why_a_run_was_cancelled_and_when_a_cancel_came_late(
    cli: Cli, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The control read that would see a cancel is minutes away: a late one finds the work done.
    monkeypatch.setenv("CONNECTOR_SYNC_CONTROL_INTERVAL", "300")
    key, data = new_dataset(items=items(1, 2))
    with backend.engine() as engine:
        ws = engine.create_workspace("w")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        cancelled = engine.cancel_run(engine.sync(conn.id).id)
        late = engine.sync(conn.id)
        data.before_row["items"] = lambda index: index == 1 and engine.cancel_run(late.id)
        worker = engine.worker(listen=False)
        assert worker.poll()
        worker.close()
    shown = cli("runs", "show", str(cancelled.id), columns=80).ok().out
    assert re.search(r"^why\s+cancelled before it started\s*$", shown, re.M), shown
    assert not re.search(r"^error\s", shown, re.M), shown
    shown = " ".join(cli("runs", "show", str(late.id), columns=200).ok().out.split())
    assert "succeeded" in shown
    assert "after the work was done: it ended succeeded" in shown, shown
    assert cli("runs", "show", str(late.id), "--json").json()["cancel_came_late"] is True
    # `sync --wait` ends with the same words; `runs list` shows a cancel's reason dim.
    with backend.engine() as engine:
        out = Console(record=True, width=100)
        print_results(out, engine.run(late.id))
        listed = runs_table([engine.run(cancelled.id)], 200)
    (reason,) = listed.columns[-1]._cells
    assert isinstance(reason, Text) and reason.style == "dim"
    assert reason.plain == "cancelled before it started"
    assert "a cancel was asked for after the work was done: the run ended succeeded" in (
        out.export_text()
    )


# -- names where they read better than ids ---------------------------------------------------------


def test_runs_and_connections_are_named_not_numbered(cli: Cli, backend: Backend) -> None:
    key, _ = new_dataset(items=items(1))
    with backend.engine() as engine:
        ws = engine.create_workspace("acme-inc")
        conn = engine.create_connection(ws.id, "tracker", "memory", config={"dataset": key})
        run = engine.sync(conn.id)
    listed = cli("runs", "list", columns=120).ok().out
    assert f"#{run.id}" in listed and f"tracker ({conn.id})" in listed, listed
    shown = cli("runs", "show", str(run.id)).ok().out
    assert re.search(rf"^connection\s+tracker \({conn.id}\)\s*$", shown, re.M), shown
    connections = cli("connections", "list", columns=120).ok().out
    assert re.search(r"\sacme-inc\s+tracker\s", connections), connections
    detail = cli("connections", "show", str(conn.id)).ok().out
    assert re.search(rf"^workspace\s+{ws.id} 'acme-inc'\s*$", detail, re.M), detail
    assert f"tracker ({conn.id})" in detail  # its recent runs


# -- only a password is a DATABASE_URL's secret ----------------------------------------------------

PASSWORD = "Cnry-db-pw-7f3a"


def test_only_a_password_is_kept_out_of_a_failed_connection_s_error(
    schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failed(url: str) -> str:
        env = {"DATABASE_URL": url, "CONNECTOR_SYNC_SCHEMA": schema}
        cli = Cli(Backend("url", env, schema, None), capsys, monkeypatch)
        return cli("workspaces", "list").one_line_error("Connection refused")

    # A URL without a password holds no secret: the error quotes it, so it can be checked.
    plain = "postgresql://postgres@127.0.0.1:1/no_password_db"
    line = failed(plain)
    assert f"cannot connect to {plain}: " in line and "[redacted]" not in line, line
    # With one, the error names the database without it.
    line = failed(f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/with_password_db")
    assert "cannot connect to postgresql://postgres@127.0.0.1:1/with_password_db: " in line
    assert PASSWORD not in line
