"""The embedded default: with DATABASE_URL unset, commands start (or reuse) a Postgres under
$CONNECTOR_SYNC_HOME, migrate it on first use and say so; two processes racing to start it
both succeed on the same server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sync.base.embedded import stop_server

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "connector-sync"


@pytest.fixture
def home(tmp_path: Path):  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    yield home
    stop_server(home)  # a fast shutdown, waited for


def test_first_use_by_two_processes_at_once(home: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.pop("CONNECTOR_SYNC_SCHEMA", None)
    env["CONNECTOR_SYNC_HOME"] = str(home)
    racers = [
        subprocess.Popen(
            [str(SCRIPT), "workspaces", "list", "--json"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes = [(p.wait(timeout=180), *p.communicate()) for p in racers]
    for code, out, err in outcomes:
        assert code == 0, err
        assert json.loads(out) == []
        assert f"database: embedded Postgres under {home.resolve() / 'pgdata'}" in err
    # migrate locks per migration file, so the two may share the files between them (each file
    # is applied once: tests/test_migrations.py); at least one of them applied some.
    assert sum("migrated just now" in err for _, _, err in outcomes) >= 1

    # The next command reuses the running server.
    again = subprocess.run(
        [str(SCRIPT), "workspaces", "create", "w", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["name"] == "w"
    assert "migrated just now" not in again.stderr


def test_a_home_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["CONNECTOR_SYNC_HOME"] = str(blocker / "home")
    result = subprocess.run(
        [str(SCRIPT), "workspaces", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "CONNECTOR_SYNC_HOME" in lines[0], result.stderr
