"""The defects a new user hit, each shown through the command line, against the test database
and against the embedded Postgres (the ``backend`` fixture): a workspace reference that meant
another workspace, a password printed, a worker without a plugin, the wrong worker process,
counts that misled, tables that lost their key columns, a database nobody could find, input
taken as given, and human output that said less than it should."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.cells import cell_len
from rich.console import Console

from connectors.simulated.server import Simulation, start_server
from sync import Engine, InvalidInput, Settings
from sync.cli import app, main
from sync.cli.commands import follow_progress, follow_view
from sync.demo.checks import Check, print_summary
from sync.errors import Conflict
from sync.store.queries import QUERIES
from tests.cli_backends import SCRIPT, Backend, Cli, WorkerProcess
from tests.conftest import make_settings
from tests.test_sync_flow import items, new_dataset

TOKEN = "t0k3n-acme-never-printed"
WIDTHS = (60, 80, 120)


@pytest.fixture
def simulated() -> Iterator[tuple[str, Simulation]]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=30, seed=3, token=TOKEN)
    url, stop = start_server(simulation)
    yield url, simulation
    stop()


def create_tracker(
    cli: Cli,
    url: str,
    *,
    name: str = "tracker",
    workspace: str = "acme-inc",
    tenant: str = "acme",
    extra: tuple[str, ...] = (),
) -> int:
    """A `simulated` connection (and its workspace, unless it exists), created by the CLI."""
    made = cli("workspaces", "create", workspace)
    assert made.code == 0 or "already exists" in made.err, made.err
    config = json.dumps({"base_url": url, "tenant": tenant, "page_size": 10})
    created = cli(
        "connections",
        "create",
        "-w",
        workspace,
        "-n",
        name,
        "-p",
        "simulated",
        "--config",
        config,
        "--credentials",
        json.dumps({"token": TOKEN}),
        *extra,
        "--json",
    ).json()
    return int(created["id"])


# -- 1. a workspace reference means exactly one thing ---------------------------------------------


def test_a_workspace_reference_is_an_id_when_all_digits_else_a_name(
    cli: Cli, backend: Backend
) -> None:
    first = cli("workspaces", "create", "first", "--json").json()
    second = cli("workspaces", "create", "second", "--json").json()
    # A name made of digits would shadow an id: `workspaces create 13` once made workspace 12
    # answer to "13".
    cli("workspaces", "create", str(first["id"])).one_line_error("digits alone", "id")
    cli("workspaces", "create", "13").one_line_error("digits alone")
    cli("workspaces", "rename", "first", "7").one_line_error("digits alone")
    assert cli("workspaces", "create", "team-13", "--json").json()["name"] == "team-13"

    created = cli(
        "connections",
        "create",
        "-w",
        str(second["id"]),
        "-n",
        "c",
        "-p",
        "simulated",
        "--config",
        '{"base_url": "http://127.0.0.1:9", "tenant": "x"}',
        "--credentials",
        '{"token": "t"}',
        "--json",
    ).json()
    assert created["workspace_id"] == second["id"]
    listed = cli("connections", "list", "-w", "second", "--json").json()
    assert [c["id"] for c in listed] == [created["id"]]
    cli("connections", "list", "-w", "999").one_line_error("no workspace with id 999")
    cli("connections", "list", "-w", "nope").one_line_error("no workspace named 'nope'")

    # The same rule in the Python API.
    with backend.engine() as engine:
        assert engine.workspace(str(second["id"])).name == "second"
        assert engine.workspace(second["id"]).name == "second"
        assert engine.workspace("second").id == second["id"]
        with pytest.raises(InvalidInput, match="digits alone"):
            engine.create_workspace("42")


# -- 2. no error path prints a password -----------------------------------------------------------

CANARY = "Cnry-5ecr3t-pw"
BAD_URLS = {
    "wrong scheme": f"mysql://root:{CANARY}@127.0.0.1:3306/x",
    "@ in the password": f"postgresql://postgres:pa@{CANARY}@127.0.0.1:5432/test",
    "missing host": f"postgresql://postgres:{CANARY}@/test",
    "port not a number": f"postgresql://postgres:{CANARY}@127.0.0.1:notaport/test",
    "port out of range": f"postgresql://postgres:{CANARY}@127.0.0.1:99999/test",
    "unclosed IPv6 host": f"postgresql://postgres:{CANARY}@[::1/test",
    "unreachable": f"postgresql://postgres:{CANARY}@127.0.0.1:1/test",
    "unknown host": f"postgresql://postgres:{CANARY}@no-such-host.invalid/test",
    "no such database": f"postgresql://postgres:{CANARY}@127.0.0.1:5432/no_such_db_x",
    "':' encoded into the user": f"postgresql://postgres%3A{CANARY}@127.0.0.1:5432/test",
    "key=value, bad option value": (
        f"host=127.0.0.1 dbname=test user=postgres password={CANARY} sslmode=bogus"
    ),
    "key=value, unterminated quote": f"host=127.0.0.1 password='{CANARY} dbname=test",
    "key=value, unknown keyword": f"host=127.0.0.1 passwd={CANARY}",
    "not a URL at all": CANARY,
    "valid (fails later)": f"postgresql://postgres:{CANARY}@127.0.0.1:5432/test",
}
# These reach the test database (with no host, through its Unix socket): their commands fail
# later, or succeed.
REACHABLE = {"missing host", "valid (fails later)"}
COMMANDS = [
    ["workspaces", "list"],
    ["migrate"],
    ["runs", "show", "999"],
    ["sync", "1", "--wait"],
    ["connections", "create", "-w", "x", "-n", "c", "-p", "simulated"],
    ["secrets", "rotate"],
    ["db", "status"],
    ["demo", "--schema", "t_never_created"],
]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_URLS), ids=list(BAD_URLS))
def test_no_error_path_prints_the_database_password(
    case: str, schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = BAD_URLS[case]
    cli = Cli(
        Backend("url", {"DATABASE_URL": url, "CONNECTOR_SYNC_SCHEMA": schema}, schema, None),
        capsys,
        monkeypatch,
    )
    for command in COMMANDS:
        result = cli(*command)
        assert CANARY not in result.out + result.err, (command, result.err)
        assert "Traceback" not in result.err
        if case not in REACHABLE and command[0] != "db":
            result.one_line_error(code=result.code)
    # The worker's own log lines, in a process of its own.
    proc = cli.script("worker", "--once")
    out, err = proc.communicate(timeout=120)
    assert CANARY not in out + err, err
    assert proc.returncode == (0 if case in REACHABLE else 2) and "Traceback" not in err


def test_a_malformed_url_is_refused_in_words_that_say_what_to_fix(
    schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def error(url: str) -> str:
        cli = Cli(
            Backend("url", {"DATABASE_URL": url, "CONNECTOR_SYNC_SCHEMA": schema}, schema, None),
            capsys,
            monkeypatch,
        )
        return cli("workspaces", "list").one_line_error()

    assert "must be a postgresql:// URL, not a mysql:// one" in error(BAD_URLS["wrong scheme"])
    assert "%40" in error(BAD_URLS["@ in the password"])
    assert "number from 1 to 65535" in error(BAD_URLS["port not a number"])
    assert "not a valid Postgres URL" in error(BAD_URLS["key=value, unknown keyword"])


# -- 3. a worker claims only what it can run -------------------------------------------------------


@pytest.mark.slow
def test_a_run_no_live_worker_can_take_stays_queued_and_says_so(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    with backend.engine() as engine:
        # `memory` is registered in this test process only: the worker process lacks it, as a
        # worker started before a plugin was installed does.
        key, _ = new_dataset(items=items(1, 2))
        ws = engine.create_workspace("acme-inc")
        mem = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        mem_run = engine.sync(mem.id)
    tracker = create_tracker(cli, url)

    worker = cli.worker("--id", "w-without-memory")
    try:
        done = cli("sync", str(tracker), "--wait", "--json").json()
        assert done["status"] == "succeeded"
        shown = cli("runs", "show", str(mem_run.id)).ok().out
        assert "no live worker has the memory connector" in " ".join(shown.split())
        listed = " ".join(cli("workers").ok().out.split())
        assert f"1 queued run(s) of provider memory (oldest #{mem_run.id}) wait" in listed
        info = {w["id"]: w for w in cli("workers", "--json").json()}
        assert "simulated" in info["w-without-memory"]["providers"]
        assert "memory" not in info["w-without-memory"]["providers"]
    finally:
        assert worker.stop() == 0
    run = cli("runs", "show", str(mem_run.id), "--json").json()
    assert (run["status"], run["attempts"]) == ("queued", [])  # never claimed, never failed


# -- 4. each worker start is its own incarnation ---------------------------------------------------


@pytest.mark.slow
def test_a_second_live_worker_with_the_same_id_is_refused_and_a_restart_records_itself(
    cli: Cli, backend: Backend
) -> None:
    first = cli.worker("--id", "dup")
    try:
        second = cli.script("worker", "--id", "dup", "--once")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and f"in use by a live worker (pid {first.pid}" in lines[0], err
        assert "Traceback" not in err
    finally:
        first.stop(signal.SIGKILL)  # a crash: no stop is recorded

    # A restart on this host after the crash takes the id over at once (its pid is gone), and
    # records its own process.
    again = cli.script("worker", "--id", "dup", "--once")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    (info,) = cli("workers", "--json").json()
    assert (info["id"], info["pid"], info["state"]) == ("dup", again.pid, "stopped")


def test_closing_an_engine_frees_the_ids_of_the_workers_made_on_it(
    engine: Engine, schema: str
) -> None:
    settings = make_settings(schema)
    with Engine(settings) as first:
        first.worker(worker_id="kept", listen=False)  # never closed by its caller
        with Engine(settings) as other, pytest.raises(Conflict, match="already used"):
            other.worker(worker_id="kept", listen=False)
    with Engine(settings) as second:
        second.worker(worker_id="kept", listen=False).close()


@pytest.mark.slow
def test_workers_starting_at_once_with_one_id_leave_exactly_one_running(
    cli: Cli, backend: Backend
) -> None:
    cli.worker("--id", "raced").stop()  # a stopped row: any starter below may take it over
    racers = [WorkerProcess(cli.script("worker", "--id", "raced"), started=False) for _ in range(4)]
    try:
        # Each one either logs its start or exits refused; nothing else can happen.
        started = [r for r in racers if r.wait_for("started", timeout=300)]
        assert len(started) == 1, [r.log for r in racers]
        for loser in (r for r in racers if r not in started):
            assert loser.stop() == 2 and "in use by a live worker" in loser.log
        (info,) = cli("workers", "--json").json()
        assert (info["pid"], info["state"]) == (started[0].pid, "alive")
    finally:
        for racer in racers:
            racer.stop()


@pytest.mark.slow
def test_one_incarnation_never_marks_another_stopped(cli: Cli, backend: Backend) -> None:
    fast = {"CONNECTOR_SYNC_HEARTBEAT_INTERVAL": "0.2", "CONNECTOR_SYNC_POLL_INTERVAL": "0.2"}
    frozen = cli.worker("--id", "same", **fast)
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        with backend.engine() as engine, engine.pool.connection() as conn:
            # What a minute of silence looks like: the heartbeat is old.
            conn.execute(
                "UPDATE workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'same'"
            )
        successor = cli.worker("--id", "same", **fast)
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    try:
        # The frozen one wakes, finds its id taken over, and stops without touching the row.
        assert frozen.wait_for("was taken over by another process"), frozen.log
        assert frozen.stop() == 0
        (info,) = cli("workers", "--json").json()
        assert (info["pid"], info["state"]) == (successor.pid, "alive")
    finally:
        assert successor.stop() == 0
    (info,) = cli("workers", "--json").json()
    assert (info["pid"], info["state"]) == (successor.pid, "stopped")


# -- 5. counts that say what happened --------------------------------------------------------------


@pytest.mark.slow
def test_runs_say_upserted_unchanged_and_tombstoned_for_the_run_and_each_attempt(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, simulation = simulated
    tracker = create_tracker(cli, url)
    rows = sum(len(simulation.tenant("acme").rows(t)) for t in ("projects", "issues"))
    worker = cli.worker("--id", "counting")
    try:
        first = cli("sync", str(tracker), "--wait").ok().out
        assert f"succeeded after 1 attempt: {rows} upserted, 0 unchanged, 0 tombstoned" in first
        again = cli("sync", str(tracker), "--wait").ok().out
        assert f"0 upserted, {rows} unchanged, 0 tombstoned" in again
        assert "records written" not in first + again
    finally:
        worker.stop()
    run_id = cli("runs", "list", "-c", str(tracker), "--json").json()[0]["id"]
    shown = cli("runs", "show", str(run_id)).ok().out
    assert f"0 upserted, {rows} unchanged, 0 tombstoned" in shown
    header = next(line for line in shown.splitlines() if line.lstrip().startswith("#"))
    assert [w for w in header.split() if w in ("upserted", "unchanged", "tombstoned")] == [
        "upserted",
        "unchanged",
        "tombstoned",
    ]


# -- 6. layout at 60, 80 and 120 columns -----------------------------------------------------------


@pytest.fixture
def crowded(backend: Backend, simulated: tuple[str, Simulation]) -> dict[str, Any]:
    """A database with long names, every status and a long error, for the layout tests."""
    url, _ = simulated
    long_name = "quarterly-revenue-reconciliation-" + "x" * 60
    with backend.engine() as engine:
        ws = engine.create_workspace("workspace-with-a-rather-long-name-" + "y" * 50)
        good = engine.create_connection(
            ws.id,
            long_name,
            "simulated",
            schedule_every=5400,
            config={"base_url": url, "tenant": "acme"},
            credentials={"token": TOKEN},
        )
        bad = engine.create_connection(
            ws.id,
            "ghost",
            "simulated_crm",
            config={"base_url": url, "tenant": "ghost"},
            credentials={"token": TOKEN},
        )
        worker = engine.worker(worker_id="layout-worker-with-a-long-identifier", listen=False)
        ok_run, bad_run = engine.sync(good.id), engine.sync(bad.id)
        while worker.poll():
            pass
        worker.close()
        queued = engine.sync(good.id)
        with engine.pool.connection() as conn:
            conn.execute("UPDATE connections SET status = 'disconnected' WHERE id = %s", (bad.id,))
            conn.execute(
                "UPDATE connection_runs SET error = jsonb_build_object('kind', 'permanent', "
                "'message', %s::text) WHERE id = %s",
                (LONG_ERROR, bad_run.id),
            )
    return {
        "connections": [good.id, bad.id],
        "runs": [ok_run.id, bad_run.id, queued.id],
        "failed": bad_run.id,
        "worker": "layout-worker-with-a-long-identifier",
    }


LONG_ERROR = (
    "GET /crm/ghost/contacts answered 404 Not Found: the tenant does not exist on this server; "
    "check the connection's config (tenant) and the provider's base_url, then retry the run "
    "with `connector-sync runs retry`; nothing was written and nothing was tombstoned"
)


def widest(text: str) -> int:
    return max(cell_len(line.rstrip()) for line in text.splitlines())


@pytest.mark.parametrize("width", WIDTHS)
def test_key_columns_never_vanish_and_output_fits_the_width(
    cli: Cli, crowded: dict[str, Any], width: int
) -> None:
    def show(*args: str) -> str:
        out = cli(*args, columns=width).ok().out
        assert widest(out) <= width, f"{args} at {width}:\n{out}"
        return out

    listed = show("connections", "list")
    for cid in crowded["connections"]:
        assert re.search(rf"^\s*{cid}\s", listed, re.M), listed
    assert "disconnected" in listed and "active" in listed

    runs = show("runs", "list")
    for rid in crowded["runs"]:
        assert f"#{rid}" in runs, runs
    for status in ("succeeded", "failed", "queued"):
        assert status in runs
    assert all(h in runs.splitlines()[0] for h in ("run", "status")), runs

    workers = show("workers")
    assert crowded["worker"] in workers and "stopped" in workers
    pid = cli("workers", "--json").json()[0]["pid"]
    assert str(pid) in workers.split()

    shown = show("runs", "show", str(crowded["failed"]))
    assert LONG_ERROR in " ".join(shown.split()), shown  # the whole error, wrapped
    show("connections", "show", str(crowded["connections"][0]))
    records = show("records", "list", str(crowded["connections"][0]))
    assert re.search(r"^\s*projects\s+\S+", records, re.M), records
    show("workspaces", "list")
    show("providers")


def test_at_80_columns_names_wrap_between_words_and_errors_print_in_full_below(
    cli: Cli, crowded: dict[str, Any], simulated: tuple[str, Simulation]
) -> None:
    listed = cli("connections", "list", columns=80).ok().out
    assert "creds" in listed.splitlines()[0], listed  # whether it has credentials stays
    rows = [line for line in listed.splitlines() if re.match(r"^\s*\d+\s", line)]
    assert len(rows) == 2 and all(row.rstrip().endswith("yes") for row in rows), listed
    # The long name wraps after its hyphens, never inside a word.
    names = " ".join(listed.split())
    for word in ("quarterly-", "revenue-", "reconciliation-"):
        assert word in names, listed

    shown = cli("runs", "show", str(crowded["failed"]), columns=80).ok().out
    assert widest(shown) <= 80, shown
    url = f"{simulated[0]}/crm/ghost/contacts"
    # Errors are below their tables, each whole on lines as wide as the console: the URL in
    # the attempt's and the table's errors is never cut.
    assert sum(url in line for line in shown.splitlines()) >= 2, shown
    headers = [line for line in shown.splitlines() if line.startswith(("#  ", "table "))]
    assert len(headers) == 2 and not any("error" in h for h in headers), shown


@pytest.mark.parametrize("width", WIDTHS)
def test_the_sync_wait_line_keeps_the_run_and_its_bar_whatever_the_note(width: int) -> None:
    out = Console(width=width, force_terminal=True, color_system=None, record=True)
    progress, task = follow_progress(out, 4211, 2)
    progress.update(task, completed=1, records=330)
    note = (
        "retrying in 28s (attempt 2 of 3) after rate_limited: 429 Too Many Requests; the "
        "provider asked to wait 30 seconds before the next request (Retry-After: 30)"
    )
    with out.capture() as captured:
        out.print(follow_view(progress, note))
    lines = captured.get().splitlines()
    assert "run #4211" in lines[0] and "━" in lines[0] and "1/2" in lines[0], lines
    assert all(cell_len(line.rstrip()) <= width for line in lines), lines
    assert "Retry-After: 30)" in " ".join(" ".join(lines).split())


# -- 7. where the database is ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_embedded_home_is_the_users_data_directory_from_any_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "xdg-data"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CONNECTOR_SYNC_HOME", "CONNECTOR_SYNC_SCHEMA")
    }
    env.update(XDG_DATA_HOME=str(data), COLUMNS="120")
    pgdata = data / "connector-sync" / "pgdata"

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        cwd.mkdir(exist_ok=True)
        return subprocess.run(
            [str(SCRIPT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
        )

    try:
        made = run("workspaces", "create", "from-a", cwd=tmp_path / "a")
        assert made.returncode == 0, made.stderr
        assert f"database: embedded Postgres under {pgdata}" in made.stderr
        seen = run("workspaces", "list", "--json", cwd=tmp_path / "b")
        assert [w["name"] for w in json.loads(seen.stdout)] == ["from-a"], seen.stderr
        assert not (tmp_path / "a" / ".connector-sync").exists()

        # A failing command says which database it used, in its one line.
        failed = run("runs", "show", "999", cwd=tmp_path / "b")
        assert failed.returncode == 2
        assert failed.stderr.strip().splitlines() == [
            f"error: no run 999 (database: embedded Postgres under {pgdata}, schema sync)"
        ]

        status = json.loads(run("db", "status", "--json", cwd=tmp_path).stdout)
        assert status["running"] and status["data_dir"] == str(pgdata) and status["pid"]
        stopped = run("db", "stop", cwd=tmp_path)
        assert f"stopped the embedded Postgres under {pgdata} (pid {status['pid']})" in (
            " ".join(stopped.stdout.split())
        ), stopped.stdout + stopped.stderr
        assert "stopped (the next command starts it)" in run("db", "status", cwd=tmp_path).stdout
        assert "is not running" in run("db", "stop", cwd=tmp_path).stdout
        # The next command starts it again, with the data it had.
        again = run("workspaces", "list", "--json", cwd=tmp_path)
        assert [w["name"] for w in json.loads(again.stdout)] == ["from-a"], again.stderr
    finally:
        run("db", "stop", cwd=tmp_path)


def test_the_demo_says_the_embedded_server_keeps_running(tmp_path: Path) -> None:
    out = Console(width=100, record=True, color_system=None)
    settings = Settings(database_url=None, home=tmp_path)
    checks = [Check("a claim", True, "evidence")]
    with out.capture() as captured:
        print_summary(out, checks, None, settings, "demo-x")  # type: ignore[arg-type]
    text = " ".join(captured.get().split())
    assert f"the embedded Postgres under {tmp_path / 'pgdata'} keeps running" in text
    assert "`connector-sync db stop` stops it" in text


# -- 8. input --------------------------------------------------------------------------------------

BAD_NAMES = {
    "201 characters": ("n" * 201, "at most 200 characters"),
    "an escape sequence": ("red\x1b[31mname", "control characters or escape"),
    "a newline": ("two\nlines", "control characters"),
    "a direction override": ("abc\u202edef", "U+202E"),
    "leading space": (" padded", "start or end with a space"),
}


def test_names_are_bounded_and_free_of_control_characters(cli: Cli) -> None:
    cli("workspaces", "create", "w" * 200).ok()
    config = '{"base_url": "http://127.0.0.1:9", "tenant": "x"}'
    for name, needle in BAD_NAMES.values():
        cli("workspaces", "create", name).one_line_error(needle)
        cli("workspaces", "rename", "w" * 200, name).one_line_error(needle)
        cli(
            "connections",
            "create",
            "-w",
            "w" * 200,
            "-n",
            name,
            "-p",
            "simulated",
            "--config",
            config,
            "--credentials",
            '{"token": "t"}',
        ).one_line_error(needle)
        cli("worker", "--id", name, "--once").one_line_error(needle)
        assert "\x1b" not in cli("workspaces", "create", name).err


def test_credentials_are_checked_against_the_connectors_model(cli: Cli) -> None:
    cli("workspaces", "create", "w").ok()
    base = [
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
    ]
    line = cli(*base, "--credentials", '{"tokn": "s3cr3t-typo"}').one_line_error(
        "credentials are invalid", "token: Field required"
    )
    assert "s3cr3t-typo" not in line
    cli(*base).one_line_error("credentials are invalid")
    cid = cli(*base, "--credentials", '{"token": "fine-token"}', "--json").json()["id"]
    cli("connections", "update", str(cid), "--credentials", '{"token": ""}').one_line_error(
        "credentials are invalid", "token"
    )


USAGE_MISTAKES = {
    "a word for an id": (["sync", "abc"], "connector-sync sync --help"),
    "a negative id": (["runs", "show", "-1"], "positive"),
    "zero": (["runs", "show", "0"], "greater than or equal to 1"),
    "an unknown option": (["runs", "list", "--bogus"], "no such option: --bogus"),
    "an unknown command": (["runz"], "no such command"),
    "a missing argument": (["records", "list"], "missing argument 'CONNECTION'"),
    "a word for a number": (["runs", "list", "--limit", "many"], "--limit"),
}


@pytest.mark.parametrize("case", list(USAGE_MISTAKES), ids=list(USAGE_MISTAKES))
def test_usage_errors_are_one_line_and_exit_2(cli: Cli, case: str) -> None:
    args, needle = USAGE_MISTAKES[case]
    cli(*args).one_line_error(needle)


@pytest.mark.slow
def test_ctrl_c_while_connecting_prints_no_traceback(
    schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # a database that never answers
        silent.settimeout(120)
        url = f"postgresql://postgres@127.0.0.1:{silent.getsockname()[1]}/test"
        cli = Cli(Backend("url", {"DATABASE_URL": url}, schema, None), capsys, monkeypatch)
        proc = cli.script("workspaces", "list")
        peer, _ = silent.accept()  # the command is inside its connect now
        with peer:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines() == ["interrupted"], err


# Loaded by the interpreter at start (PYTHONPATH): holds the import of the command line until
# stdin says go, so a Ctrl-C lands while it loads.
HOLD_THE_IMPORT = """
import sys


class HoldTheImport:
    def find_spec(self, name, path=None, target=None):
        if name == "sync.cli":
            sys.meta_path.remove(self)
            print("loading", file=sys.stderr, flush=True)
            sys.stdin.readline()
        return None


sys.meta_path.insert(0, HoldTheImport())
"""


@pytest.mark.slow
def test_ctrl_c_while_the_command_line_loads_prints_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(HOLD_THE_IMPORT)
    proc = subprocess.Popen(
        [str(SCRIPT), "workspaces", "list"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().strip() == "loading"  # inside the import now
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines() == ["interrupted"], err


@pytest.mark.slow
def test_ctrl_c_while_following_a_run_prints_no_traceback(
    cli: Cli, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    tracker = create_tracker(cli, url)
    proc = cli.script("sync", str(tracker), "--wait")
    assert proc.stdout is not None
    first = proc.stdout.readline()  # no worker runs: it waits, and says so
    assert "no worker is running" in first, first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "stopped following run" in err


@pytest.mark.slow
def test_ctrl_c_stops_a_worker_cleanly(cli: Cli) -> None:
    worker = cli.worker("--id", "interrupted")
    assert worker.stop(signal.SIGINT) == 0
    assert "Traceback" not in worker.log and "worker interrupted stopped" in worker.log


# -- 9. human output -------------------------------------------------------------------------------

STAMP = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z]{2,5}"


def test_runs_show_numbers_attempts_in_order_with_dates_zones_and_whole_errors(
    cli: Cli, backend: Backend
) -> None:
    from connectors import RetryableError

    key, data = new_dataset(items=items(1, 2, 3))
    data.failures["items"] = (2, RetryableError("the upstream cache was cold " + "z" * 150))
    with backend.engine() as engine:
        ws = engine.create_workspace("w")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        run = engine.sync(conn.id)
        worker = engine.worker(listen=False)
        worker.poll()
        assert engine.run(run.id).status == "queued"
        shown = cli("runs", "show", str(run.id), columns=80).ok().out
        assert widest(shown) <= 80
        # The whole error, wrapped: nothing of it is cut.
        assert "theupstreamcachewascold" + "z" * 150 in "".join(shown.split()), shown
        del data.failures["items"]
        with engine.pool.connection() as c:
            c.execute(QUERIES.make_run_due, {"run_id": run.id})
        worker.poll()
        worker.close()
    shown = cli("runs", "show", str(run.id), columns=100).ok().out
    for label in ("queued", "started", "finished"):
        assert re.search(rf"^{label}\s+{STAMP}\s*$", shown, re.M), shown
    numbered = [line.split()[:2] for line in shown.splitlines() if re.match(r"\s*[12]\s", line)]
    assert numbered == [["1", "retry"], ["2", "succeeded"]], shown


def test_wording(cli: Cli, backend: Backend, simulated: tuple[str, Simulation]) -> None:
    url, _ = simulated
    tracker = create_tracker(cli, url, extra=("--every", "15m"))
    assert cli("connections", "show", str(tracker)).ok().out.count("15m00s") == 0
    assert re.search(r"^every\s+15m\s*$", cli("connections", "show", str(tracker)).ok().out, re.M)
    assert re.search(r"\s15m\s", cli("connections", "list").ok().out)

    queued = cli("sync", str(tracker), "--json").json()
    cli("connections", "delete", str(tracker)).ok()
    shown = cli("runs", "show", str(queued["id"])).ok().out
    assert "cancelled: cancelled" not in shown and "the connection was deleted" in shown
    line = cli("runs", "cancel", str(queued["id"])).one_line_error("has already ended (cancelled)")
    assert "is cancelled" not in line

    for args, metavar in (
        (["sync", "--help"], "{CONNECTION}"),
        (["runs", "show", "--help"], "{RUN}"),
    ):
        usage = cli(*args).ok().out
        assert metavar in usage and "_id" not in usage, usage


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and group of the command line, as the words that name it."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_paths(sub, (*path, name))


def test_no_help_shows_a_type_placeholder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # typer's own placeholders (`<bool>`, `<str>`, `<int range> [x>=1]`) say nothing an
    # option's or argument's name and help do not.
    monkeypatch.setenv("COLUMNS", "100")
    paths = list(command_paths(typer.main.get_command(app)))
    assert ("records", "list") in paths and ("grant",) in paths
    for path in paths:
        with pytest.raises(SystemExit) as exited:
            main([*path, "--help"])
        help_text = capsys.readouterr().out
        assert exited.value.code == 0 and "Usage: connector-sync" in help_text, path
        assert not re.search(r"<[a-z][a-z ]*>", help_text), help_text
