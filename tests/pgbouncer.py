"""A private PgBouncer in transaction pooling mode in front of a local Postgres, for running the
integration suite (``pytest --pgbouncer``) or a benchmark the way a fleet behind PgBouncer
would meet the database.

It uses Debian's ``pgbouncer`` (``apt-get install pgbouncer``; ``.ci/run`` installs it),
writes its configuration, log and pid file into a temporary directory, listens on a free port
of 127.0.0.1 only (no Unix socket), and forwards every database name to the one Postgres it was
given. It is configured as an operator would configure it for a fleet: ``pool_mode =
transaction`` and nothing else relaxed. In particular it rejects the startup parameters it does
not track (``options`` among them) unless ``ignore_startup_parameters`` names them.

    with PgBouncer("postgresql://postgres@127.0.0.1:5432/test") as bouncer:
        bouncer.url  # postgresql://postgres@127.0.0.1:PORT/test, through PgBouncer
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import conninfo


class PgBouncerError(RuntimeError):
    pass


def binary() -> str | None:
    """The pgbouncer executable (Debian puts it in /usr/sbin), or None if not installed."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """Start with ``start()`` (or ``with``), stop with ``stop()``; ``url`` is ``upstream`` with
    host and port replaced by PgBouncer's, ``admin_url`` its console (``SHOW POOLS``...)."""

    def __init__(
        self,
        upstream: str,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 20,
        max_server_connections: int = 40,
        ignore_startup_parameters: tuple[str, ...] = (),
    ) -> None:
        params = conninfo.conninfo_to_dict(upstream)
        host = params.get("host") or "127.0.0.1"
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise PgBouncerError(f"the private PgBouncer fronts a local Postgres only, not {host}")
        self.upstream = upstream
        self.user = str(params.get("user") or "postgres")
        self.port = _free_port()
        self._upstream_port = int(params.get("port") or 5432)
        self._pool_mode = pool_mode
        self._pool_size = pool_size
        self._max_server = max_server_connections
        self._ignore = ignore_startup_parameters
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._up = threading.Event()  # set when PgBouncer logs that it is up, or exits
        self._said_up = False

    @property
    def url(self) -> str:
        return conninfo.make_conninfo(self.upstream, host="127.0.0.1", port=str(self.port))

    @property
    def admin_url(self) -> str:
        """PgBouncer's console, which answers ``SHOW ...`` (simple query protocol only)."""
        return conninfo.make_conninfo(self.url, dbname="pgbouncer", user=self.user, password="")

    @property
    def config(self) -> Path:
        if self._dir is None:
            raise PgBouncerError("PgBouncer is not running")
        return self._dir / "pgbouncer.ini"

    @property
    def log(self) -> str:
        """What PgBouncer logged so far: errors, warnings, a line of stats a minute."""
        if self._dir is None:
            return ""
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _config(self) -> str:
        assert self._dir is not None
        lines = [
            "[databases]",
            # Every database name goes to the same local server, under the client's own user.
            f"* = host=127.0.0.1 port={self._upstream_port}",
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            f"logfile = {self._dir / 'pgbouncer.log'}",
            f"pidfile = {self._dir / 'pgbouncer.pid'}",
            # Errors and warnings only, not a line per connection.
            "log_connections = 0",
            "log_disconnections = 0",
            f"pool_mode = {self._pool_mode}",
            f"default_pool_size = {self._pool_size}",
            # The server may be shared: however many pools there are, this user's server
            # connections stay under a cap, and idle ones are closed soon to make room.
            f"max_user_connections = {self._max_server}",
            "server_idle_timeout = 5",
            "max_client_conn = 2000",
            # The local server trusts loopback; users not in the file are looked up on it.
            "auth_type = trust",
            f"auth_file = {self._dir / 'users.txt'}",
            f"auth_user = {self.user}",
            f"admin_users = {self.user}",
        ]
        if self._ignore:
            lines.append(f"ignore_startup_parameters = {','.join(self._ignore)}")
        return "\n".join(lines) + "\n"

    def start(self) -> PgBouncer:
        exe = binary()
        if exe is None:
            raise PgBouncerError(
                "pgbouncer is not installed: `apt-get install pgbouncer` (.ci/run does it)"
            )
        self._dir = Path(tempfile.mkdtemp(prefix="connector-sync-pgbouncer-"))
        (self._dir / "users.txt").write_text(f'"{self.user}" ""\n')
        config = self._dir / "pgbouncer.ini"
        config.write_text(self._config())
        command = [exe, str(config)]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root; it reads its files as the user it switches to.
            shutil.chown(self._dir, "postgres")
            for path in self._dir.iterdir():
                shutil.chown(path, "postgres")
            command = [exe, "-u", "postgres", str(config)]
        self._up.clear()
        self._said_up = False
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        # Its log also goes to stderr, which must be read all along: once the pipe's buffer is
        # full, PgBouncer blocks on the write and stops serving every client.
        threading.Thread(target=self._copy_stderr, args=(self._process,), daemon=True).start()
        self._wait_ready()
        return self

    def _copy_stderr(self, process: subprocess.Popen[bytes]) -> None:
        """Copies PgBouncer's stderr into stderr.log, and says when it logs that it is up (it
        listens by then) or exits."""
        assert self._dir is not None and process.stderr is not None
        with (self._dir / "stderr.log").open("wb") as copy:
            for line in process.stderr:
                copy.write(line)
                copy.flush()
                if b" process up: " in line:
                    self._said_up = True
                    self._up.set()
        self._up.set()

    def _wait_ready(self) -> None:
        assert self._process is not None and self._dir is not None
        if not self._up.wait(15):
            self.stop()
            raise PgBouncerError("pgbouncer did not say it was up within 15 s")
        if not self._said_up:  # its stderr ended: it exited
            said = (self._dir / "stderr.log").read_text(errors="replace").strip().splitlines()
            self.stop()
            raise PgBouncerError(f"pgbouncer exited at start: {said[-1] if said else '?'}")
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=2) as conn:
            conn.execute("SHOW VERSION")

    def stop(self, *, keep_log: Path | None = None) -> None:
        """Stop PgBouncer and remove its directory; ``keep_log``: copy its log there first."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # close every connection and exit
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            if keep_log is not None:
                keep_log.parent.mkdir(parents=True, exist_ok=True)
                keep_log.write_text(self.log)
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
