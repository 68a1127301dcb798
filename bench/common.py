"""What every benchmark shares: a throw-away database, our engine on it, the peers' worker
processes, percentiles and the printed table.

Each benchmark creates its own database (``bench_<what>_<random>``) on the server named by
``DATABASE_URL`` and drops it when done, even after a failure, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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


def machine_line(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'), "
            "current_setting('synchronous_commit'), current_setting('shared_buffers')"
        ).fetchone()
    assert row is not None
    version, fsync, sync_commit, buffers = row
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores, Python {platform.python_version()}, Postgres {version} "
        f"(fsync={fsync}, synchronous_commit={sync_commit}, shared_buffers={buffers}), "
        f"psycopg {psycopg.__version__}; load average {load}"
    )


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start
