"""The wheel a non-editable ``pip install .`` installs: built here by hatchling's own wheel
builder (in-process, offline, under a second), it holds the operator page's templates and static
files and every SQL file, and the engine unpacked from it alone migrates a database."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest
from hatchling.builders.wheel import WheelBuilder

from tests.conftest import DATABASE_URL, DIRECT_URL

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = list(WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"]))
    assert len(built) == 1
    return Path(built[0])


def on_disk(folder: str, pattern: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern) if p.is_file()}


def test_the_wheel_holds_the_pages_files_and_every_sql_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = on_disk("sync/ui/templates", "*")
    static = on_disk("sync/ui/static", "*")
    assert templates and static
    assert templates <= names, templates - names
    assert static <= names, static - names
    # sql/ is shipped inside the package, where sync.store.sqlfiles looks for it in an installation.
    sql = {name.replace("sql/", "sync/sql/", 1) for name in on_disk("sql", "*.sql")}
    assert any(Path(name).name.startswith("0001_") for name in sql)
    assert sql <= names, sql - names
    assert "connector_sync_cli.py" in names  # the `connector-sync` script's module


@pytest.fixture
def unpacked(wheel: Path, tmp_path: Path) -> Path:
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    return tmp_path / "site"


@pytest.mark.slow
def test_the_engine_from_the_wheel_alone_migrates_a_database(unpacked: Path, schema: str) -> None:
    """Nothing of the checkout is on the path: the process runs from the unpacked wheel (its
    dependencies from this environment), as after a non-editable install."""
    script = (
        "import sys, sync, sync.store.sqlfiles, sync.ui.app;"
        "print(sync.__file__); print(sync.store.sqlfiles.sql_dir()); print(sync.ui.app.STATIC);"
        "sys.argv = ['connector-sync', 'migrate'];"
        "import connector_sync_cli; connector_sync_cli.main()"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(unpacked),
        "DATABASE_URL": DATABASE_URL,
        "CONNECTOR_SYNC_SCHEMA": schema,
    }
    # -P: not the working directory first on the path; -s: no user site.
    result = subprocess.run(
        [sys.executable, "-P", "-s", "-c", script],
        cwd=unpacked.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    package, sql_dir, static = result.stdout.splitlines()[:3]
    for where in (package, sql_dir, static):
        assert Path(where).is_relative_to(unpacked), where
    versions = sorted(int(p.name[:4]) for p in (ROOT / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    with psycopg.connect(DIRECT_URL) as conn:
        applied = conn.execute(
            f"SELECT version FROM {schema}.schema_migrations ORDER BY version"
        ).fetchall()
    assert [v for (v,) in applied] == versions
