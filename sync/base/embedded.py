"""The embedded default: with DATABASE_URL unset, a Postgres run by the ``pgserver`` package
under ``$CONNECTOR_SYNC_HOME/pgdata`` (the home defaults to the user's data directory), started
on demand and left running for the next command, until ``connector-sync db stop``.

Several processes may ask for it at once (the demo starts workers while the CLI is still
connecting; a user opens two shells): a file lock under the home directory lets one of them
initialise and start the server while the others wait, then find it running."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sync.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # initdb on a slow disk takes a while; waiting longer means it is stuck
STOP_TIMEOUT = 60.0  # a fast shutdown ends every session and checkpoints; longer means stuck


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


@dataclass(frozen=True)
class ServerStatus:
    """The embedded Postgres of one home, as its data directory tells."""

    data_dir: Path
    created: bool  # initialised (initdb has run)
    pid: int | None  # the running server's process, None when it is not running
    started_at: datetime | None
    socket_dir: Path | None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def log(self) -> Path:
        return self.data_dir / "log"

    def to_json(self) -> dict[str, object]:
        return {
            "data_dir": str(self.data_dir),
            "created": self.created,
            "running": self.running,
            "pid": self.pid,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "socket_dir": str(self.socket_dir) if self.socket_dir else None,
            "log": str(self.log),
        }


def server_status(home: Path) -> ServerStatus:
    """Whether the embedded Postgres under ``home`` exists and runs; never starts it."""
    data = data_dir(home)
    created = (data / "PG_VERSION").exists()
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        started = datetime.fromtimestamp(int(lines[2]), UTC)
        socket_dir = Path(lines[4]) if len(lines) > 4 and lines[4].strip() else None
    except (OSError, ValueError, IndexError):  # not running, or a file being written
        return ServerStatus(data, created, None, None, None)
    if not _alive(pid):  # a crash left the file behind
        return ServerStatus(data, created, None, None, None)
    return ServerStatus(data, created, pid, started, socket_dir)


def stop_server(home: Path) -> ServerStatus:
    """Stop the embedded Postgres under ``home`` (a fast shutdown: open sessions are ended,
    committed work is kept) and return its status before the stop."""
    before = server_status(home)
    if before.pid is None:
        return before
    with _exclusive(before.data_dir.parent / ".pgdata.lock", what=str(before.data_dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(before.pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _alive(before.pid):
            if time.monotonic() > deadline:
                raise DatabaseUnavailable(
                    f"the embedded Postgres (pid {before.pid}) did not stop within "
                    f"{STOP_TIMEOUT:.0f} s; see {before.log}"
                )
            time.sleep(0.1)
    return before


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs as another user (pgserver's, when we are root)
        return True
    return True
