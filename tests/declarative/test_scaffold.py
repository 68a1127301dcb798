"""`connector-sync new-connector NAME` writes a plugin package whose tests pass as written, run
by pytest in a process of their own as its author would run them; installed, the package's entry
point makes the provider known to connector-sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATABASE_URL

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "connector-sync"


def test_the_scaffold_passes_its_own_tests_and_installs(tmp_path: Path, schema: str) -> None:
    package, site = tmp_path / "tiny", tmp_path / "site"
    made = subprocess.run(
        [str(SCRIPT), "new-connector", "tiny_api", "--dir", str(package)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert (package / "tiny_api_connector.py").exists()

    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=package,
        env={**os.environ, "DATABASE_URL": DATABASE_URL},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout

    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
            "--no-index", "--target", str(site), str(package),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(site), "DATABASE_URL": DATABASE_URL,
           "CONNECTOR_SYNC_SCHEMA": schema}  # fmt: skip
    listed = subprocess.run(
        [str(SCRIPT), "providers", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    found = {p["provider"]: p for p in json.loads(listed.stdout)}
    assert found["tiny_api"]["class"] == "tiny_api_connector.TinyApiConnector"
    assert [t["name"] for t in found["tiny_api"]["tables"]] == ["items"]
