"""Repairing everything from the command line, against the test database and the embedded
Postgres: a connection's name, config, credentials and schedule; resuming a disconnected
connection; renaming and deleting a workspace; re-encrypting secrets; looking at the records a
sync wrote; a deleted connection's run history."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from connectors.simulated.server import Simulation, start_server
from sync import Engine
from tests.cli_backends import Backend, Cli

TOKEN = "t0k3n-acme-repair"


@pytest.fixture
def simulated() -> Iterator[tuple[str, Simulation]]:
    simulation = Simulation()
    simulation.add_tenant("acme", size=20, seed=5, token=TOKEN)
    url, stop = start_server(simulation)
    yield url, simulation
    stop()


def connection(cli: Cli, url: str, name: str = "tracker", workspace: str = "acme-inc") -> int:
    made = cli("workspaces", "create", workspace)
    assert made.code == 0 or "already exists" in made.err, made.err
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
        json.dumps({"base_url": url, "tenant": "acme"}),
        "--credentials",
        json.dumps({"token": TOKEN}),
        "--json",
    ).json()
    return int(created["id"])


def drain(engine: Engine) -> None:
    """Run every claimable run with a worker of this process."""
    worker = engine.worker(listen=False)
    try:
        while worker.poll():
            pass
    finally:
        worker.close()


def test_connections_update_changes_name_config_and_schedule(
    cli: Cli, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    cid = connection(cli, url)
    connection(cli, url, name="other")

    renamed = cli("connections", "update", str(cid), "--name", "tracker-eu", "--json").json()
    assert renamed["name"] == "tracker-eu"
    cli("connections", "update", str(cid), "--name", "other").one_line_error(
        "already has a connection 'other'"
    )

    # --config changes only the keys given; the result must still validate.
    merged = cli("connections", "update", str(cid), "--config", '{"page_size": 7}', "--json")
    assert merged.json()["config"] == {"base_url": url, "tenant": "acme", "page_size": 7}
    cli("connections", "update", str(cid), "--config", '{"tenant": null}').one_line_error(
        "config is invalid", "tenant"
    )
    cli("connections", "update", str(cid), "--config", '{"bogus": 1}').one_line_error(
        "config is invalid", "bogus"
    )

    before = datetime.now(UTC)
    scheduled = cli("connections", "update", str(cid), "--every", "2h", "--json").json()
    assert scheduled["schedule_every"] == 7200.0
    # A connection that had no schedule is due at once, as a new one is.
    assert datetime.fromisoformat(scheduled["next_run_at"]) <= before + timedelta(minutes=1)
    human = cli("connections", "update", str(cid), "--every", "15m").ok().out
    assert "updated: schedule, synced every 15m" in " ".join(human.split())
    shorter = cli("connections", "show", str(cid), "--json").json()
    assert datetime.fromisoformat(shorter["next_run_at"]) <= datetime.now(UTC) + timedelta(
        minutes=15
    )
    unscheduled = cli("connections", "update", str(cid), "--no-schedule", "--json").json()
    assert unscheduled["schedule_every"] is None and unscheduled["next_run_at"] is None

    cli("connections", "update", str(cid), "--every", "1h", "--no-schedule").one_line_error(
        "not both"
    )
    cli("connections", "update", str(cid)).one_line_error("nothing to change")
    cli("connections", "update", "999", "--name", "x").one_line_error("no connection 999")


def test_new_credentials_reconnect_a_disconnected_connection_and_resume_needs_them(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation], tmp_path: Path
) -> None:
    url, _ = simulated
    cid = connection(cli, url)
    with backend.engine() as engine, engine.pool.connection() as conn:
        # What a refused token does to a connection (see the executor's auth failures).
        conn.execute("UPDATE connections SET status = 'disconnected' WHERE id = %s", (cid,))

    refused = cli("connections", "resume", str(cid)).one_line_error(
        "disconnected", "--credentials", "--force"
    )
    assert "resume" in refused
    forced = cli("connections", "resume", str(cid), "--force")
    assert forced.code == 0 and "warning: --force resumes" in forced.err
    assert cli("connections", "show", str(cid), "--json").json()["status"] == "active"

    with backend.engine() as engine, engine.pool.connection() as conn:
        conn.execute("UPDATE connections SET status = 'disconnected' WHERE id = %s", (cid,))
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"token": "a-brand-new-token"}))
    updated = cli("connections", "update", str(cid), "--credentials", f"@{creds}").ok()
    assert "updated: credentials; it is active again" in " ".join(updated.out.split())
    assert "a-brand-new-token" not in updated.out + updated.err
    assert cli("connections", "show", str(cid), "--json").json()["status"] == "active"
    cli("connections", "update", str(cid), "--credentials", '{"tokn": "x"}').one_line_error(
        "credentials are invalid"
    )


def test_workspaces_rename_and_delete_purge_every_connection_and_keep_history(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    first = connection(cli, url, name="one")
    second = connection(cli, url, name="two")
    ws = cli("workspaces", "list", "--json").json()[0]

    assert cli("workspaces", "rename", "acme-inc", "acme-eu", "--json").json()["name"] == "acme-eu"
    cli("workspaces", "create", "taken").ok()
    cli("workspaces", "rename", str(ws["id"]), "taken").one_line_error("already exists")

    with backend.engine() as engine:
        sync_run = engine.sync(first).id
        drain(engine)

        deleted = cli("workspaces", "delete", "acme-eu", "--json").json()
        purges = deleted["purges"]
        assert sorted(p["connection_id"] for p in purges) == [first, second]
        assert all(p["kind"] == "purge" for p in purges)
        listing = {w["name"]: w for w in cli("workspaces", "list", "--json").json()}
        assert listing["acme-eu"]["deleted_at"] is not None  # listed while its purges run
        assert "deleting" in cli("workspaces", "list").ok().out
        cli(
            "connections",
            "create",
            "-w",
            str(ws["id"]),
            "-n",
            "late",
            "-p",
            "simulated",
            "--config",
            json.dumps({"base_url": url, "tenant": "acme"}),
            "--credentials",
            json.dumps({"token": TOKEN}),
        ).one_line_error(f"no workspace {ws['id']} (or it was deleted)")
        cli("connections", "list", "-w", "acme-eu").one_line_error("no workspace named")

        drain(engine)

    assert [w["name"] for w in cli("workspaces", "list", "--json").json()] == ["taken"]
    assert cli("connections", "list", "--json").json() == []
    # Its name is free again, and its history is still there by id.
    cli("workspaces", "create", "acme-eu").ok()
    history = cli("runs", "list", "-w", str(ws["id"]), "--json").json()
    assert {r["id"] for r in history} >= {sync_run, *(p["id"] for p in purges)}
    assert all(r["status"] == "succeeded" for r in history)


def test_runs_list_still_finds_a_deleted_connections_runs(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    cid = connection(cli, url)
    with backend.engine() as engine:
        sync_run = engine.sync(cid).id
        drain(engine)
        purge = cli("connections", "delete", str(cid), "--json").json()
        drain(engine)
    cli("connections", "show", str(cid)).one_line_error(f"no connection {cid}")
    found = cli("runs", "list", "-c", str(cid), "--json").json()
    assert [r["id"] for r in found] == [purge["id"], sync_run]
    assert all(r["connection_id"] is None and r["deleted_connection_id"] == cid for r in found)
    assert f"{cid} (deleted)" in cli("runs", "list", "-c", str(cid)).ok().out
    assert f"{cid} (deleted)" in cli("runs", "show", str(sync_run)).ok().out


def test_records_list_shows_what_was_synced_and_what_was_tombstoned(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, simulation = simulated
    cid = connection(cli, url)
    tenant = simulation.tenant("acme")
    assert "no records in connection" in cli("records", "list", str(cid)).ok().out
    with backend.engine() as engine:
        engine.sync(cid)
        drain(engine)
        changes = tenant.advance()
        engine.sync(cid)
        drain(engine)
    gone = {str(i) for i in changes["issues"]["deleted"]}
    assert gone

    issues = cli("records", "list", str(cid), "issues", "--limit", "1000", "--json").json()
    assert {r["external_id"] for r in issues} == {str(row["id"]) for row in tenant.rows("issues")}
    assert all(r["table_name"] == "issues" and r["deleted_at"] is None for r in issues)
    everything = cli("records", "list", str(cid), "--deleted", "--limit", "1000", "--json").json()
    tombstoned = {
        r["external_id"]
        for r in everything
        if r["deleted_at"] is not None and r["table_name"] == "issues"
    }
    assert tombstoned == gone
    assert {r["table_name"] for r in everything} == {"projects", "issues"}

    human = cli("records", "list", str(cid), "issues", "--limit", "3").ok().out
    assert "the first 3 records; --limit shows more" in human
    assert human.splitlines()[0].split()[:2] == ["table", "id"]
    cli("records", "list", "999").one_line_error("no connection 999")


def test_secrets_rotate_re_encrypts_every_credential_with_the_first_key(
    cli: Cli, simulated: tuple[str, Simulation], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = simulated
    import os

    old = os.environ["CONNECTOR_SYNC_SECRET_KEYS"]
    new = Fernet.generate_key().decode()
    cid = connection(cli, url)
    connection(cli, url, name="second")
    change = ["connections", "update", str(cid), "--config", '{"page_size": 9}']
    # Changing the config reads the credentials (for the rate budget they draw on).
    cli(*change, CONNECTOR_SYNC_SECRET_KEYS=new).one_line_error("cannot be decrypted")

    rotated = cli("secrets", "rotate", "--json", CONNECTOR_SYNC_SECRET_KEYS=f"{new},{old}")
    assert rotated.json() == {"rotated": 2}
    human = cli("secrets", "rotate", CONNECTOR_SYNC_SECRET_KEYS=f"{new},{old}").ok().out
    assert "of 2 connection(s) with the first key of CONNECTOR_SYNC_SECRET_KEYS" in (
        " ".join(human.split())
    )
    cli(*change, CONNECTOR_SYNC_SECRET_KEYS=new).ok()  # the old key is no longer needed


def test_resume_says_that_a_scheduled_connection_syncs_now(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation]
) -> None:
    url, _ = simulated
    cid = connection(cli, url)
    cli("connections", "pause", str(cid)).ok()
    said = " ".join(cli("connections", "resume", str(cid)).ok().out.split())
    assert said == (
        f"connection {cid} resumed (status active) it has no schedule: it syncs when asked "
        f"(`connector-sync sync {cid}`)"
    )
    cli("connections", "update", str(cid), "--every", "15m").ok()
    cli("connections", "pause", str(cid)).ok()
    said = " ".join(cli("connections", "resume", str(cid)).ok().out.split())
    assert said.endswith(
        "its schedule makes it due now: a worker starts a sync, then one every 15m"
    ), said
    shown = cli("connections", "show", str(cid), "--json").json()
    assert datetime.fromisoformat(shown["next_run_at"]) <= datetime.now(UTC)


class Terminal(io.StringIO):
    """What a person types at a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_delete_asks_first_on_a_terminal_and_never_in_a_script(
    cli: Cli, backend: Backend, simulated: tuple[str, Simulation], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = simulated
    cid = connection(cli, url)
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    declined = cli("connections", "delete", str(cid))
    assert declined.code == 1 and "nothing was done" in declined.err, declined
    assert f"Delete connection {cid} 'tracker' (simulated)" in declined.err
    assert cli("connections", "show", str(cid), "--json").json()["status"] == "active"
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert "is being deleted" in cli("connections", "delete", str(cid)).ok().out

    other = connection(cli, url, name="crm", workspace="globex")
    monkeypatch.setattr(sys, "stdin", Terminal("\n"))  # Enter alone is no
    assert cli("workspaces", "delete", "globex").code == 1
    assert cli("connections", "show", str(other), "--json").json()["status"] == "active"
    assert "is being deleted" in cli("workspaces", "delete", "globex", "--yes").ok().out
    # A script (no terminal) is never asked.
    third = connection(cli, url, name="third")
    assert "is being deleted" in cli("connections", "delete", str(third), stdin="").ok().out
