"""The ``connector-sync`` command's entry point. It imports nothing of the engine before it can
answer a Ctrl-C: loading the command line takes a noticeable moment (its dependencies are
large), and an interrupt then would otherwise end in a traceback."""

from __future__ import annotations

import sys

INTERRUPTED = 130  # as sync.cli.common says


def main() -> None:
    try:
        from sync.cli import main as run
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
    run()
