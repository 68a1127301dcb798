"""The worked example in docs/writing-a-connector.md runs as written: its files are extracted
and their tests run in a separate pytest process, as a connector author would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import DATABASE_URL

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
