"""The `connector-sync` command line (the full command set arrives with its own issue)."""

from __future__ import annotations

import sys


def main() -> None:
    print("connector-sync: the command line is not built yet", file=sys.stderr)
    sys.exit(2)
