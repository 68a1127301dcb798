"""What every benchmark shares: a throw-away database (or a whole private Postgres), our
engine on it, the peers' worker processes, percentiles, the printed table and the ``--json``
document.

Each benchmark creates its own database (``bench_<what>_<random>``) on the server named by
``DATABASE_URL`` and drops it when done, even after a failure, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql
from rich.console import Console
from rich.table import Table

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DIR = Path(__file__).resolve().parent
NODE_DIR = BENCH_DIR / "node"
SCHEMA = "sync"

console = Console(width=140)


def server_url() -> str:
    return os.environ.get("DATABASE_URL", DEFAULT_URL)


def url_for(dbname: str, base: str | None = None) -> str:
    params = conninfo.conninfo_to_dict(base or server_url())
    params["dbname"] = dbname
    return conninfo.make_conninfo(**params)


def as_uri(url: str) -> str:
    """A postgresql:// URI (node's pg and dlt want one)."""
    params = conninfo.conninfo_to_dict(url)
    user = params.get("user", "postgres")
    password = params.get("password")
    auth = f"{user}:{password}" if password else user
    host = params.get("host", "127.0.0.1")
    return f"postgresql://{auth}@{host}:{params.get('port', 5432)}/{params.get('dbname', '')}"


@contextlib.contextmanager
def scratch_database(what: str) -> Iterator[str]:
    """Create a database for one benchmark run, yield its URL, drop it afterwards."""
    name = f"bench_{what}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield url_for(name)
    finally:
        with psycopg.connect(server_url(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def settings_for(url: str, **overrides: Any) -> Any:
    from sync import Settings

    values: dict[str, Any] = {"database_url": url, "schema_name": SCHEMA}
    # The bench connectors take no credentials; a throw-away key keeps SecretBox from writing
    # a key file, and child processes inherit it.
    if not os.environ.get("CONNECTOR_SYNC_SECRET_KEYS"):
        from cryptography.fernet import Fernet

        os.environ["CONNECTOR_SYNC_SECRET_KEYS"] = Fernet.generate_key().decode()
    values.update(overrides)
    return Settings(**values)


def migrate(url: str) -> None:
    from sync import Engine

    with Engine(settings_for(url), pool_size=3) as engine:
        engine.migrate()


def connect(url: str, *, schema: str | None = SCHEMA) -> psycopg.Connection[Any]:
    options = f"-c search_path={schema}" if schema else ""
    return psycopg.connect(url, autocommit=True, options=options)


def python() -> str:
    return sys.executable


def spawn(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
    """A child process on this interpreter, with stdout piped and the bench importable."""
    env = {**os.environ, **kwargs.pop("env", {})}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCH_DIR.parent), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stdin=kwargs.pop("stdin", subprocess.DEVNULL),
        text=True,
        env=env,
        **kwargs,
    )


def run_node(args: Sequence[str], timeout: float) -> str:
    """Run bench/node/peers.mjs and return its stdout (its last line is JSON)."""
    if not (NODE_DIR / "node_modules").is_dir():
        raise RuntimeError("the node peers are not installed: run `npm ci --prefix bench/node`")
    done = subprocess.run(
        ["node", str(NODE_DIR / "peers.mjs"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=NODE_DIR,
    )
    if done.returncode != 0:
        raise RuntimeError(f"node {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


class Marks:
    """A drain's wall-clock marks, taken in its handler: the start of the first call and the end
    of the last, with the jobs done. Safe across threads (our lanes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.target = 0  # with a target, ``done`` is set once that many jobs have ended
        self.done = threading.Event()

    def started(self) -> None:
        with self._lock:
            if not self.first:
                self.first = time.time()

    def ended(self, jobs: int = 1) -> None:
        with self._lock:
            self.count += jobs
            self.last = time.time()
            if self.target and self.count >= self.target:
                self.done.set()

    def report(self, **extra: Any) -> None:
        line = {"count": self.count, "first": self.first, "last": self.last, **extra}
        print(json.dumps(line), flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """min-max of repeated measurements, for the table."""
    if len(values) < 2:
        return ""
    return f"{min(values):,.0f}-{max(values):,.0f}"


def ratio(value: float, reference: float) -> str:
    if not reference or value != value or reference != reference:
        return "-"
    return f"{value / reference:.2f}x"


@dataclass
class Column:
    title: str
    justify: str = "right"


def print_table(title: str, columns: Sequence[str | Column], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left", show_lines=False)
    for col in columns:
        c = col if isinstance(col, Column) else Column(col)
        table.add_column(c.title, justify=c.justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)


def machine_info(url: str | None) -> dict[str, Any]:
    """What the numbers depend on: cores, versions, the server's durability settings, and the
    load average when the benchmark started (2 cores: above 2 means it queued for CPU)."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if url is not None:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'), "
                "current_setting('synchronous_commit'), current_setting('shared_buffers'), "
                "current_setting('max_connections')"
            ).fetchone()
        assert row is not None
        info["postgres"] = dict(
            zip(
                ("version", "fsync", "synchronous_commit", "shared_buffers", "max_connections"),
                row,
                strict=True,
            )
        )
    return info


def machine_line(info: Mapping[str, Any]) -> str:
    """``machine_info`` in one line, for the top of a benchmark's output."""
    load = ", ".join(f"{x:.2f}" for x in info["load_average"])
    server = ""
    if pg := info.get("postgres"):
        server = (
            f", Postgres {pg['version']} (fsync={pg['fsync']}, "
            f"synchronous_commit={pg['synchronous_commit']}, shared_buffers={pg['shared_buffers']})"
        )
    return (
        f"{info['cores']} cores, Python {info['python']}{server}, psycopg {info['psycopg']}; "
        f"load average {load}"
    )


# -- --json -------------------------------------------------------------------------------


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON document on stdout (progress and tables go to stderr)",
    )


def json_mode(args: argparse.Namespace) -> None:
    """With ``--json``, stdout carries the JSON document alone: everything meant for people
    (progress, tables) moves to stderr. Call it before printing anything."""
    if getattr(args, "json", False):
        console.file = sys.stderr


def git_commit() -> str | None:
    """The commit the benchmark ran on, with ``+dirty`` if the engine, SQL or bench differ."""
    root = BENCH_DIR.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "sync", "connectors", "sql", "bench"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def jsonable(value: Any) -> Any:
    """Dataclasses, tuples, paths and counters as JSON values; NaN and infinities as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def print_json(
    bench: str,
    args: argparse.Namespace,
    results: Any,
    *,
    machine: Mapping[str, Any] | None = None,
    **sections: Any,
) -> None:
    """The one document a ``--json`` run prints: which benchmark, on which commit and machine,
    with which options, and its results (each benchmark's rows, with the same names as its
    table's columns where it can). Does nothing without ``--json``."""
    if not getattr(args, "json", False):
        return
    document = {
        "bench": bench,
        "commit": git_commit(),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "options": {k: v for k, v in vars(args).items() if k != "json"},
        "results": results,
        **sections,
    }
    sys.stdout.write(json.dumps(jsonable(document), indent=1, allow_nan=False) + "\n")
    sys.stdout.flush()


# -- a private Postgres -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """A throwaway Postgres cluster under ``root`` on a spare port of 127.0.0.1, built by the
    same server binaries as the system's, with initdb's defaults (which are the settings the
    shared server runs with: fsync and synchronous_commit on, shared_buffers 128MB) plus
    ``settings``."""

    def __init__(self, root: Path, settings: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.data = root / "pgdata"
        self.port = free_port()
        self.settings = {"max_connections": "300", "shared_buffers": "128MB", **(settings or {})}
        self.bin = Path(
            subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
        if not (self.bin / "initdb").exists():
            versions = sorted(Path("/usr/lib/postgresql").iterdir())
            self.bin = versions[-1] / "bin"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # Postgres refuses to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True)

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        lines = [
            f"port = {self.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            *(f"{name} = {value}" for name, value in self.settings.items()),
        ]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w", "start")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again. ``fast`` is a clean shutdown; ``immediate`` is a crash: the
        restart runs crash recovery, which empties every unlogged table (run_seen_keys)."""
        # Not `pg_ctl restart`: it would start the new postmaster without a log file, holding
        # our captured stdout open forever.
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        self.start()

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
