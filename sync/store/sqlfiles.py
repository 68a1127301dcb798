"""Where the shipped ``sql/`` directory is: inside the wheel at ``sync/sql``, or at the top of a
source checkout."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def sql_dir() -> Path:
    package = Path(__file__).resolve().parent.parent  # sync/
    packaged = package / "sql"
    if packaged.is_dir():
        return packaged
    checkout = package.parent / "sql"
    if checkout.is_dir():
        return checkout
    raise RuntimeError("the sql/ directory is missing from this installation")
