"""The README's promises: its first lines are the two commands (CI runs the second verbatim), and
its Python quickstart runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.conftest import DATABASE_URL

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_the_readme_starts_with_the_two_commands() -> None:
    lines = README.splitlines()
    assert lines[2:6] == [
        "```sh",
        "pip install . && connector-sync demo",
        "pip install -e '.[test]' && pytest",
        "```",
    ]


@pytest.mark.slow
def test_the_python_quickstart_runs(schema: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has no Python quickstart"
    quickstart = blocks[0]
    assert len(quickstart.strip().splitlines()) <= 25
    result = subprocess.run(
        [sys.executable, "-c", quickstart],
        env={
            **os.environ,
            "DATABASE_URL": DATABASE_URL,
            "CONNECTOR_SYNC_SCHEMA": schema,
            # The connection's typed views in a schema dropped with the test's.
            "CONNECTOR_SYNC_READER_SCHEMA_PREFIX": f"{schema}_",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    status, count = result.stdout.splitlines()
    assert status.startswith("succeeded ")
    assert count == "120 issues synced"  # the default tenant acme has 120 issues

    # The SQL a reader runs next, as the README shows it, on the views that sync built.
    (block,) = re.findall(r"```sql\n(.*?)```", README, flags=re.S)
    statements = [q for q in block.split(";") if q.strip(" \n-") and "SELECT" in q]
    assert len(statements) == 3
    with psycopg.connect(DATABASE_URL) as reader:
        found = [
            reader.execute(q.replace("acme_inc_tracker.", f"{schema}_acme_inc_tracker.")).fetchall()
            for q in statements
        ]
    assert len(found[0]) == 5 and all(state != "closed" for _, _, state, _ in found[0])
    assert sum(count for _, count in found[1]) == 120
    assert found[2] == []  # a first sync tombstones nothing
