"""The embedded default: with DATABASE_URL unset, a Postgres run by the ``pgserver`` package
under ``$CONNECTOR_SYNC_HOME/pgdata``, started on demand and left running for the next
command.

Several processes may ask for it at once (the demo starts workers while the CLI is still
connecting; a user opens two shells): a file lock under the home directory lets one of them
initialise and start the server while the others wait, then find it running."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sync.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # initdb on a slow disk takes a while; waiting longer means it is stuck


def data_dir(home: Path) -> Path:
    """Where the embedded Postgres keeps its data."""
    return (home.expanduser() / "pgdata").resolve()


def embedded_url(home: Path) -> str:
    """Start (or reuse) the embedded Postgres and return its URL."""
    data = data_dir(home)
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create {data} for the embedded Postgres ({exc.strerror}); set "
            "CONNECTOR_SYNC_HOME to a writable directory, or set DATABASE_URL"
        ) from None
    pgserver = _import_pgserver()
    with _exclusive(data.parent / ".pgdata.lock", what=str(data)):
        try:
            server = pgserver.get_server(data, cleanup_mode=None)
            return str(server.get_uri())
        except Exception as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise DatabaseUnavailable(
                f"the embedded Postgres under {data} did not start ({reason}); its log is "
                f"{data / 'log'}; remove {data} to start afresh, or set DATABASE_URL"
            ) from None


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); it falls back fine.
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError:  # pragma: no cover - it is a dependency
            raise DatabaseUnavailable(
                "DATABASE_URL is unset and the embedded Postgres (pgserver) is not installed; "
                "set DATABASE_URL or `pip install pgserver`"
            ) from None
    # pgserver logs the server's whole log on a failed start; our error names the file instead.
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    return pgserver


@contextlib.contextmanager
def _exclusive(path: Path, *, what: str) -> Iterator[None]:
    """An inter-process lock on ``path``, waited for at most ``START_TIMEOUT``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailable(
                        f"another process has been starting the embedded Postgres under {what} "
                        f"for over {START_TIMEOUT:.0f} s; see {Path(what) / 'log'}, or set "
                        "DATABASE_URL"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
