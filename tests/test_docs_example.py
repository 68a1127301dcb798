"""The worked example in docs/writing-a-connector.md runs as written: its files are extracted
and their tests run in a separate pytest process, as a connector author would run them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATABASE_URL

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

DOC = Path(__file__).parent.parent / "docs" / "writing-a-connector.md"
BLOCK = re.compile(r"```python\n# (\S+\.py)\n(.*?)```", re.DOTALL)


def test_the_worked_example_passes(tmp_path: Path) -> None:
    files = BLOCK.findall(DOC.read_text())
    assert {name for name, _ in files} == {"acme_tasks.py", "conftest.py", "test_acme_tasks.py"}
    for name, body in files:
        (tmp_path / name).write_text(body)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "DATABASE_URL": DATABASE_URL, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


TOML = re.compile(r"```toml\n# pyproject\.toml\n(.*?)```", re.DOTALL)


def test_the_plugin_package_installs_and_a_worker_loads_it(tmp_path: Path, schema: str) -> None:
    """The doc's pyproject.toml and acme_tasks.py, built and installed as a package: the
    installed connector-sync lists the provider with its fields, and a worker started with
    the package installed records that it can run it."""
    files = dict(BLOCK.findall(DOC.read_text()))
    (pyproject,) = TOML.findall(DOC.read_text())
    package, site = tmp_path / "package", tmp_path / "site"
    package.mkdir()
    (package / "pyproject.toml").write_text(pyproject)
    (package / "acme_tasks.py").write_text(files["acme_tasks.py"])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(package),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "DATABASE_URL": DATABASE_URL,
        "CONNECTOR_SYNC_SCHEMA": schema,
    }
    script = Path(sys.executable).parent / "connector-sync"

    def run(*args: str) -> str:
        result = subprocess.run(
            [str(script), *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    found = {p["provider"]: p for p in json.loads(run("providers", "--json"))}
    assert found["acme_tasks"]["class"] == "acme_tasks.AcmeTasks"
    assert [f["name"] for f in found["acme_tasks"]["credentials"]] == ["token"]
    assert {t["name"] for t in found["acme_tasks"]["tables"]} == {"tasks", "task_events"}
    run("migrate")
    run("worker", "--once", "--id", "with-plugin")
    (worker,) = json.loads(run("workers", "--json"))
    assert "acme_tasks" in worker["providers"]
