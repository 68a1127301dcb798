"""The build enforces style, types and layering: ruff (with its bound on a function's complexity,
pyproject.toml), mypy, and the import-linter contracts (`connectors` never imports `sync`; the
layers of `sync`, with no cycles)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "sync", "connectors", "tests", "bench", "examples"],
        ["ruff", "format", "--check", "sync", "connectors", "tests", "bench", "examples"],
        ["mypy"],
        ["lint-imports"],
    ],
    ids=["ruff", "ruff-format", "mypy", "import-linter"],
)
def test_static_check(command: list[str]) -> None:
    result = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
