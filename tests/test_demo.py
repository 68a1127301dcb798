"""`connector-sync demo` end to end, as a user runs it, against the test database in a schema of
its own (so CI does not depend on the embedded Postgres): it must check every claim it shows
in the database and exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATABASE_URL

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "connector-sync"


def test_demo_runs_and_every_claim_holds(schema: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(SCRIPT), "demo", "--schema", schema],
        env={
            **os.environ,
            "DATABASE_URL": DATABASE_URL,
            "CONNECTOR_SYNC_HOME": str(tmp_path),
            "COLUMNS": "200",  # the claims are matched whole: no table cell wraps
            # The connections' typed views in schemas dropped with the test's.
            "CONNECTOR_SYNC_READER_SCHEMA_PREFIX": f"{schema}_",
        },
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every claim held" in result.stdout
    assert "✗" not in result.stdout
    for claim in (
        "ran in parallel",
        "never overlapped",
        "waited for Retry-After",
        "became tombstones",
        "was cancelled",
        "the purge waited for the running sync",
        "sees the live records",
    ):
        assert claim in result.stdout, claim
    # It ends with a reader's SQL over a typed view, and a few of its rows.
    tail = result.stdout[result.stdout.index("look around:") :]
    assert f"FROM {schema}_demo_" in tail and "_acme_tracker.issues WHERE state" in tail
    assert "Issue " in tail
    # The workers were told to stop and did; their logs are where the demo said.
    logs = list((tmp_path / "demo-logs").glob("*.log"))
    assert len(logs) == 2
    assert all("stopped" in log.read_text() for log in logs)
