"""``python -m sync.cli``: the ``connector-sync`` command line."""

from sync.cli import main

main()
