"""The chaos run's short mode, in CI: worker processes killed, frozen and cut off, Postgres
restarted, runs cancelled and connections deleted mid-sync; every required zero must be zero
(bench/chaos.py exits 1 otherwise and prints its summary)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Every test here starts a process of its own (see tests/conftest.py).
pytestmark = pytest.mark.slow


def test_the_short_chaos_run_ends_all_zeros() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.chaos"],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, summary
    assert "all zeros" in result.stderr, summary
    print(result.stdout)
