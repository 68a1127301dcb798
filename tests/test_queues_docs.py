"""The application example in docs/queues.md runs as written: its module and its tests are
extracted and run in a separate pytest process, as an application's developer would run them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

DOC = Path(__file__).parent.parent / "docs" / "queues.md"
BLOCK = re.compile(r"```python\n# (\S+\.py)\n(.*?)```", re.DOTALL)


def test_the_testing_example_passes(tmp_path: Path) -> None:
    testing = {"knowledge.py", "test_knowledge.py"}
    files = [(name, body) for name, body in BLOCK.findall(DOC.read_text()) if name in testing]
    assert {name for name, _ in files} == testing
    for name, body in files:
        (tmp_path / name).write_text(body)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
