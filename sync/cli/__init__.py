"""The ``connector-sync`` command line: a thin layer over the Python API (:class:`sync.Engine`).
``main`` is the script's entry point; ``commands`` holds ``sync`` and ``runs`` and the entry
point, the other commands are in a module each (``tenants``, ``operate``, ``documents``,
``queues``), and what they share in ``common`` and ``console``."""

from sync.cli.commands import app, main

__all__ = ["app", "main"]
