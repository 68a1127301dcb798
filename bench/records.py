"""Sync write throughput, WAL and memory: a simulated provider table of N records of ~1 KB of
JSON, read in pages of 1,000 through a connector's ``read()`` by a real worker process.

    python -m bench.records [--quick] [--n N] [--small N] [--dlt-n N] [--no-dlt]

Phases, each a run of the same connection: the first sync (every record new), a resync with
1 % of the records changed (the hash skip), a resync with 1 % deleted upstream (tombstones).
Each phase runs in a fresh worker process whose peak RSS (``ru_maxrss``) is reported.
Records/s is the table's size over the run's duration (``run_attempts``, server clock).

WAL: ``pg_current_wal_flush_lsn()`` before and after each phase is cluster-wide, and this
Postgres may be shared; so the bytes of WAL records that touch this benchmark's database are
also summed with ``pg_walinspect`` (commit records, which name no relation, excluded), with the
part of it that is full-page images. Each phase starts right after a CHECKPOINT (see ``Wal``).
The phase "resync, 1 % changed, wal_compression=lz4" changes the same rows again with
``wal_compression`` set for the benchmark's database (``ALTER DATABASE``), to show what that
setting saves.

Compared with, on the same server and the same generated records:
- the ``COPY`` ceiling: ``COPY`` into a table like ``records`` (same columns, same primary key),
  with the engine's own canonical JSON and content hash computed per record;
- ``COPY`` into an UNLOGGED staging table, then one ``INSERT ... SELECT ... ON CONFLICT`` (the
  shape of the fastest upsert);
- generating and encoding the records alone (the Python floor every contender pays);
- dlt (``dlt[postgres]``) loading the same records with ``write_disposition="merge"``.
The same sizes run at ``--small`` (10 k) records, to show that RSS is flat.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import conninfo, sql

import bench.connectors  # noqa: F401 - registers the bench connectors
from bench import dataset
from bench.common import (
    Column,
    add_json_option,
    as_uri,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    print_json,
    print_table,
    python,
    ratio,
    scratch_database,
    settings_for,
    spawn,
)


@dataclass
class Row:
    size: int
    system: str
    phase: str
    seconds: float
    wal_db: float | None = None  # bytes, attributed to this database
    wal_all: float | None = None  # bytes, cluster-wide
    wal_fpi: float | None = None  # bytes of wal_db that are full-page images
    rss_kb: int | None = None
    counts: str = ""
    note: str = ""

    @property
    def rate(self) -> float:
        return self.size / self.seconds if self.seconds else float("nan")


# -- WAL ----------------------------------------------------------------------------------


class Wal:
    """WAL written while a phase runs: cluster-wide (``pg_current_wal_flush_lsn()`` before and
    after) and attributed to this database with ``pg_walinspect``, read once the phase has
    ended. A temporary replication slot, created as the phase starts, keeps its segments from
    being recycled (a phase may write more than ``max_wal_size``), and the decoding never
    competes with the contenders for CPU. Each phase starts right after a CHECKPOINT, so each
    pays the full-page images of the pages it touches first: the worst case, and the same for
    every phase."""

    def __init__(self, url: str) -> None:
        self.url = url
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone()
            assert row is not None
            self.db_oid = row[0]
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self.inspect = True
            except psycopg.Error:
                self.inspect = False

    @contextlib.contextmanager
    def meter(self) -> Iterator[WalMeter]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        meter = WalMeter(self)
        try:
            yield meter
        finally:
            meter.stop()


class WalMeter:
    def __init__(self, wal: Wal) -> None:
        self.wal = wal
        self.conn = psycopg.connect(wal.url, autocommit=True)
        self.in_db: float | None = None
        self.fpi: float | None = None
        self.total = 0.0
        self.kept = False
        if wal.inspect:
            try:  # temporary: dropped with this session, whatever happens to the benchmark
                self.conn.execute(
                    "SELECT pg_create_physical_replication_slot(%s, true, true)",
                    (f"bench_records_{uuid.uuid4().hex[:8]}",),
                )
                self.kept = True
            except psycopg.Error:
                pass  # no slot to spare: only the cluster-wide figure
        self.first = self._lsn()

    def _lsn(self) -> str:
        # The flush position, not the write position: a run's record batches commit
        # asynchronously, so WAL may be written but not yet flushed, and pg_walinspect refuses
        # to read past the flush position. Every phase ends with a synchronous commit, which
        # flushes all it wrote.
        row = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def stop(self) -> None:
        end = self._lsn()
        if self.kept and end != self.first:
            # record_length includes the record's full-page images (fpi_length of it).
            row = self.conn.execute(
                "SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) "
                "FROM pg_get_wal_records_info(%s, %s) WHERE block_ref LIKE %s",
                (self.first, end, f"%/{self.wal.db_oid}/%"),
            ).fetchone()
            assert row is not None
            self.in_db, self.fpi = float(row[0]), float(row[1])
        elif self.kept:
            self.in_db = self.fpi = 0.0
        row = self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, self.first))
        found = row.fetchone()
        assert found is not None
        self.total = float(found[0])
        self.conn.close()


# -- ours ---------------------------------------------------------------------------------


def run_ours(url: str, wal: Wal, connection_id: int, size: int, phase: dataset.Phase) -> Row:
    from sync import Engine

    with connect(url) as conn:
        conn.execute(
            "UPDATE connections SET config = config || jsonb_build_object('phase', %s::text) "
            "WHERE id = %s",
            (phase.name, connection_id),
        )
        # New sessions of this database take it: the worker started below.
        database = sql.Identifier(conn.info.dbname)
        if phase.wal_compression:
            setting = sql.SQL("SET wal_compression = {}").format(sql.Literal(phase.wal_compression))
        else:
            setting = sql.SQL("RESET wal_compression")
        conn.execute(sql.SQL("ALTER DATABASE {} ").format(database) + setting)
    with Engine(settings_for(url), pool_size=3) as engine:
        run_id = engine.sync(connection_id).id
    proc = spawn(
        [python(), "-m", "bench.worker", "--url", url, "--mode", "drain"], stdin=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdin is not None
    if proc.stdout.readline().strip() != "READY":
        raise RuntimeError("the worker did not start")
    with wal.meter() as meter:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
    total, in_db, fpi = meter.total, meter.in_db, meter.fpi
    with connect(url) as conn:
        row = conn.execute(
            "SELECT r.status, r.results, extract(epoch FROM a.finished_at - a.started_at) "
            "FROM connection_runs r JOIN run_attempts a ON a.run_id = r.id WHERE r.id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    status, results, seconds = row
    items = results.get("items", {})
    note = ""
    if status != "succeeded":
        # Report it and go on; a requeued run is cancelled so the next phase gets a new one.
        note = f"run {status}: {(items.get('error') or {}).get('message', '')}"[:160]
        console.print(f"[red]{phase.name} at {size:,}: {note}[/red]")
        if status == "queued":
            with Engine(settings_for(url), pool_size=3) as engine:
                engine.cancel_run(run_id)
    counts = (
        f"{items.get('upserted', 0):,} up / {items.get('unchanged', 0):,} same / "
        f"{items.get('tombstoned', 0):,} tomb"
    )
    return Row(
        size,
        "connector-sync",
        phase.name,
        float(seconds or 0),
        in_db,
        total,
        fpi,
        out["maxrss_kb"],
        counts,
        note,
    )


# -- the others, each in a child process (python -m bench.records --child WHAT ...) --------


def child(what: str, url: str, n: int, phase_name: str, workdir: str) -> None:
    phase = dataset.phase_named(phase_name)
    started = time.perf_counter()
    if what == "generate":
        from sync.runs.records import encode

        for rec in dataset.records(n, phase):
            encode(rec, "items", str(rec["id"]))
    elif what in ("copy", "staging"):
        copy_into(url, n, phase, staging=what == "staging")
    elif what == "dlt":
        dlt_load(url, n, phase, workdir)
    else:
        raise SystemExit(f"unknown child {what}")
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "maxrss_kb": usage.ru_maxrss}), flush=True)


COPY_TABLE = """
CREATE TABLE IF NOT EXISTS public.copy_records (LIKE sync.runs.records INCLUDING ALL);
CREATE UNLOGGED TABLE IF NOT EXISTS public.copy_staging (
    external_id text NOT NULL, data jsonb NOT NULL, content_hash bytea NOT NULL
);
TRUNCATE public.copy_records, public.copy_staging;
"""


def copy_into(url: str, n: int, phase: dataset.Phase, *, staging: bool) -> None:
    from sync.runs.records import encode

    owner = uuid.uuid4()
    with psycopg.connect(url) as conn:
        for statement in COPY_TABLE.strip().split(";\n"):
            conn.execute(statement)
        conn.commit()
        with conn.cursor() as cur:
            if staging:
                command = "COPY public.copy_staging (external_id, data, content_hash) FROM STDIN"
            else:
                command = (
                    "COPY public.copy_records (connection_id, table_name, external_id, data, "
                    "content_hash, written_by) FROM STDIN"
                )
            with cur.copy(command) as copy:
                for rec in dataset.records(n, phase):
                    key = str(rec["id"])
                    text, digest = encode(rec, "items", key)
                    if staging:
                        copy.write_row((key, text, digest))
                    else:
                        copy.write_row((1, "items", key, text, digest, owner))
            if staging:
                cur.execute(
                    "INSERT INTO public.copy_records AS r (connection_id, table_name, "
                    "external_id, data, content_hash, written_by) "
                    "SELECT 1, 'items', external_id, data, content_hash, %s "
                    "FROM public.copy_staging "
                    "ON CONFLICT (connection_id, table_name, external_id) DO UPDATE "
                    "SET data = EXCLUDED.data, content_hash = EXCLUDED.content_hash, "
                    "updated_at = now(), written_by = EXCLUDED.written_by",
                    (owner,),
                )
        conn.commit()


def dlt_load(url: str, n: int, phase: dataset.Phase, workdir: str) -> None:
    import dlt

    @dlt.resource(name="items", primary_key="id", write_disposition="merge")
    def items() -> Any:
        yield from dataset.pages(n, phase, 1000)

    params = conninfo.conninfo_to_dict(url)
    # dlt insists on a password; a server that trusts loopback ignores it.
    params.setdefault("password", "unused")
    pipeline = dlt.pipeline(
        pipeline_name=f"bench_{n}",
        destination=dlt.destinations.postgres(credentials=as_uri(conninfo.make_conninfo(**params))),
        dataset_name=f"dlt_{n}",
        pipelines_dir=workdir,
    )
    pipeline.run(items())


def run_child(what: str, url: str, wal: Wal, size: int, phase: dataset.Phase, workdir: str) -> Row:
    env = {
        # No telemetry leaves the machine; dlt keeps its state under the scratch directory.
        "RUNTIME__DLTHUB_TELEMETRY": "false",
        "DLT_DATA_DIR": workdir,
        "DLT_PROJECT_DIR": workdir,
    }
    proc = spawn(
        [
            python(),
            "-m",
            "bench.records",
            "--child",
            what,
            "--url",
            url,
            "--n",
            str(size),
            "--phase",
            phase.name,
            "--workdir",
            workdir,
        ],
        env=env,
    )
    with wal.meter() as meter:
        out, _ = proc.communicate(timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{what} exited with {proc.returncode}")
    data = json.loads(out.strip().splitlines()[-1])
    total, in_db, fpi = (
        (meter.total, meter.in_db, meter.fpi) if what != "generate" else (0.0, 0.0, 0.0)
    )
    names = {
        "generate": "generate + encode only (no database)",
        "copy": "COPY (the ceiling)",
        "staging": "COPY to UNLOGGED staging + INSERT ... ON CONFLICT",
        "dlt": "dlt, merge disposition",
    }
    return Row(size, names[what], phase.name, data["seconds"], in_db, total, fpi, data["maxrss_kb"])


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 k records only")
    parser.add_argument("--n", type=int, help="records in the big table (default 1,000,000)")
    parser.add_argument("--small", type=int, default=10_000, help="the small table (10 k)")
    parser.add_argument("--dlt-n", type=int, help="largest size dlt loads (default: all)")
    parser.add_argument("--no-dlt", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.n, args.phase, args.workdir)
        return
    json_mode(args)
    sizes = [args.small] if args.quick else [args.small, args.n or 1_000_000]
    dlt_max = args.dlt_n if args.dlt_n is not None else max(sizes)
    rows: list[Row] = []

    with scratch_database("records") as url, tempfile.TemporaryDirectory() as workdir:
        console.print(f"[bold]bench.records[/bold]: sizes {', '.join(f'{s:,}' for s in sizes)}")
        machine = machine_info(url)
        console.print(machine_line(machine))
        from sync import Engine

        with Engine(settings_for(url), pool_size=3) as engine:
            engine.migrate()
            workspace = engine.create_workspace("records")
            connection_ids = {
                size: engine.create_connection(
                    workspace.id, f"records-{size}", "bench_records", config={"n": size}
                ).id
                for size in sizes
            }
        wal = Wal(url)
        if not wal.inspect:
            console.print("[yellow]pg_walinspect unavailable: WAL is cluster-wide only[/yellow]")
        for size in sizes:
            for phase in dataset.PHASES:
                rows.append(_show(run_ours(url, wal, connection_ids[size], size, phase)))
            first = dataset.FIRST
            for what in ("generate", "copy", "staging"):
                rows.append(_show(run_child(what, url, wal, size, first, workdir)))
            if not args.no_dlt and size <= dlt_max:
                for phase in (dataset.FIRST, dataset.CHANGED):
                    try:
                        rows.append(_show(run_child("dlt", url, wal, size, phase, workdir)))
                    except Exception as exc:
                        console.print(f"[red]dlt failed: {exc}[/red]")
                        break
    report(rows)
    print_json(
        "records",
        args,
        [{**asdict(row), "records_per_s": row.rate} for row in rows],
        machine=machine,
    )


def _show(row: Row) -> Row:
    console.print(
        f"  {row.size:>9,} {row.system:50} {row.phase:22} {row.rate:10,.0f} rec/s  "
        f"{row.seconds:8.2f} s  RSS {(row.rss_kb or 0) / 1024:6.0f} MB"
    )
    return row


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _wal_ratio(row: Row, first: Row | None) -> str:
    if first is None or row is first:
        return ""
    if row.wal_db is None or first.wal_db is None:
        return "-"  # not known for this database; the cluster-wide column is beside it
    return ratio(row.wal_db, first.wal_db)


def report(rows: list[Row]) -> None:
    table = []
    for row in rows:
        copy = next((r for r in rows if r.size == row.size and r.system.startswith("COPY (")), None)
        first = next(
            (
                r
                for r in rows
                if r.size == row.size and r.system == row.system and r.phase == dataset.FIRST.name
            ),
            None,
        )
        table.append(
            [
                f"{row.size:,}",
                row.system,
                row.phase,
                f"{row.rate:,.0f}",
                f"{row.seconds:.2f}",
                ratio(row.rate, copy.rate) if copy else "-",
                _mb(row.wal_db),
                _mb(row.wal_all),
                _mb(row.wal_fpi),
                _wal_ratio(row, first),
                f"{(row.rss_kb or 0) / 1024:,.0f}",
                row.note or row.counts,
            ]
        )
    print_table(
        "Record writes (~1 KB JSON each, pages of 1,000)",
        [
            "records",
            Column("system", "left"),
            Column("phase", "left"),
            "records/s",
            "seconds",
            "x COPY",
            "WAL MB (this db)",
            "WAL MB (cluster)",
            "of it full-page images MB",
            "WAL x first",
            "peak RSS MB",
            Column("upserted / unchanged / tombstoned", "left"),
        ],
        table,
    )


if __name__ == "__main__":
    main()
