"""The ingestion job kind end to end: chunks per second, the worker's memory from 5 MB to 500 MB,
and what resuming after a kill costs.

    python -m bench.ingestions [--sizes 5,50,500] [--resume-mb 20] [--json]

Each text file (the generated corpus of ``bench.documents``) is queued with ``Engine.ingest``
and indexed by a fresh worker process that polls until the ingestion has ended, as
``connector-sync worker`` does: the claim, the count pass (``total_units``), batches of 200
chunks each embedded by the hashing embedder and written in a fenced transaction with its
checkpoint, the tail delete and the scope re-check. Reported per size: chunks, seconds from the
claim to ready (the database's own timestamps), chunks per second, and the worker's peak RSS
(``VmHWM``) beside its RSS once started: it must stay flat from 5 MB to 500 MB.

Resume cost: a file of ``--resume-mb`` is indexed once without interruption, then again in
another workspace by a worker that is killed with SIGKILL half-way through; its lease is let
run out and a second worker resumes it. Reported: the uninterrupted time, the resumed attempt's
time, and the resume's overhead over the half it had left (its count
pass and its skip to the checkpoint) against what a job queue without checkpoints pays: the
whole document again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    add_json_option,
    connect,
    console,
    json_mode,
    machine_info,
    machine_line,
    migrate,
    print_json,
    print_table,
    python,
    scratch_database,
    settings_for,
    spawn,
)
from bench.documents import MB, _rss_mb, write_corpus


@dataclass
class SizeRow:
    size_mb: int
    chunks: int
    seconds: float
    rss_start_mb: float
    rss_peak_mb: float

    @property
    def rate(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0


@dataclass
class ResumeRow:
    size_mb: int
    chunks: int
    uninterrupted_s: float
    killed_at_chunk: int
    resumed_s: float

    @property
    def left_s(self) -> float:
        """The share of the uninterrupted time the resumed attempt had left to do."""
        return self.uninterrupted_s * (self.chunks - self.killed_at_chunk) / self.chunks

    @property
    def overhead_s(self) -> float:
        return self.resumed_s - self.left_s


# -- the worker child ------------------------------------------------------------------------


def child_worker(url: str, ingestion_id: int) -> None:
    """A worker that polls until the ingestion has ended (or it is killed)."""
    from sync import Engine

    with Engine(settings_for(url, poll_interval=0.05), pool_size=4) as engine:
        worker = engine.worker(listen=False)
        start_rss = _rss_mb()
        print(json.dumps({"started": True}), flush=True)
        try:
            while not engine.ingestion(ingestion_id).is_terminal:
                if not worker.poll():
                    time.sleep(0.05)
        finally:
            worker.close()
    print(json.dumps({"rss_start_mb": start_rss, "rss_peak_mb": _rss_mb()}), flush=True)


def _worker(url: str, ingestion_id: int) -> Any:
    return spawn([python(), "-m", "bench.ingestions", "--child", url, "--id", str(ingestion_id)])


def _ingest(url: str, path: Path, workspace: str) -> int:
    from sync import Engine

    with Engine(settings_for(url), pool_size=3) as engine:
        ws = engine.create_workspace(workspace)
        return engine.ingest(path, ws.id).id


def _timing(url: str, ingestion_id: int) -> dict[str, Any]:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT status, total_units, processed_units, attempts, "
            "extract(epoch FROM finished_at - started_at) AS seconds "
            "FROM ingestions WHERE id = %s",
            (ingestion_id,),
        ).fetchone()
    assert row is not None
    return dict(zip(("status", "chunks", "processed", "attempts", "seconds"), row, strict=True))


def index_once(url: str, path: Path, size: int, workspace: str = "docs") -> SizeRow:
    ingestion_id = _ingest(url, path, f"{workspace}-{size}")
    proc = _worker(url, ingestion_id)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the worker failed (exit {proc.returncode})")
    rss = json.loads(out.strip().splitlines()[-1])
    timing = _timing(url, ingestion_id)
    if timing["status"] != "ready":
        raise RuntimeError(f"the ingestion ended {timing['status']}")
    return SizeRow(size, int(timing["chunks"]), float(timing["seconds"]), **rss)


def resume_after_kill(url: str, path: Path, size: int) -> ResumeRow:
    calm = index_once(url, path, size, "calm")
    ingestion_id = _ingest(url, path, f"killed-{size}")
    proc = _worker(url, ingestion_id)
    half = calm.chunks // 2
    with connect(url) as conn:
        # A benchmark may watch the clock: poll the checkpoint until it passes half-way.
        while True:
            row = conn.execute(
                "SELECT processed_units FROM ingestions WHERE id = %s", (ingestion_id,)
            ).fetchone()
            if row and row[0] >= half:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = conn.execute(
            "SELECT processed_units FROM ingestions WHERE id = %s", (ingestion_id,)
        ).fetchone()[0]
        conn.execute(
            "UPDATE ingestions SET lease_expires_at = now() - interval '1 second', "
            "started_at = NULL WHERE id = %s",
            (ingestion_id,),
        )
    began = time.perf_counter()
    second = _worker(url, ingestion_id)
    second.communicate()
    resumed_s = time.perf_counter() - began
    timing = _timing(url, ingestion_id)
    if timing["status"] != "ready" or timing["attempts"] != 2:
        raise RuntimeError(f"the resumed ingestion ended {timing}")
    return ResumeRow(
        size,
        calm.chunks,
        calm.seconds,
        int(killed_at),
        float(timing["seconds"]) if timing["seconds"] else resumed_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,50,500", help="file sizes in MB (5,50,500)")
    parser.add_argument("--resume-mb", type=int, default=20, help="file size for the kill run")
    add_json_option(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--id", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_worker(args.child, args.id)
        return

    json_mode(args)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows: list[SizeRow] = []
    resume: ResumeRow | None = None
    with scratch_database("ingestions") as url:
        console.print(f"[bold]bench.ingestions[/bold]: {', '.join(f'{s} MB' for s in sizes)}")
        machine = machine_info(url)
        console.print(machine_line(machine))
        migrate(url)
        workdir = Path(os.environ.get("TMPDIR", "/tmp"))
        for size in sizes:
            path = workdir / f"bench-ingestion-{size}mb-{os.getpid()}.txt"
            write_corpus(path, size * MB)
            try:
                row = index_once(url, path, size)
            finally:
                path.unlink(missing_ok=True)
            rows.append(row)
            console.print(
                f"  {size:>4} MB {row.chunks:>9,} chunks {row.seconds:8.1f} s "
                f"{row.rate:8,.0f} chunks/s  RSS {row.rss_start_mb:.0f} -> {row.rss_peak_mb:.0f} MB"
            )
        if args.resume_mb:
            path = workdir / f"bench-ingestion-resume-{os.getpid()}.txt"
            write_corpus(path, args.resume_mb * MB)
            try:
                resume = resume_after_kill(url, path, args.resume_mb)
            finally:
                path.unlink(missing_ok=True)
    print_table(
        "Ingestions end to end (claim to ready; batches of 200, hashing embedder)",
        ["MB", "chunks", "seconds", "chunks/s", "worker RSS at start MB", "worker peak RSS MB"],
        [
            [
                r.size_mb,
                f"{r.chunks:,}",
                f"{r.seconds:.1f}",
                f"{r.rate:,.0f}",
                f"{r.rss_start_mb:.0f}",
                f"{r.rss_peak_mb:.0f}",
            ]
            for r in rows
        ],
    )
    if resume is not None:
        print_table(
            f"Resume after SIGKILL half-way ({resume.size_mb} MB, {resume.chunks:,} chunks)",
            [
                "uninterrupted s",
                "killed at chunk",
                "resumed attempt s",
                "its share of the work s",
                "resume overhead s",
                "without checkpoints s",
            ],
            [
                [
                    f"{resume.uninterrupted_s:.1f}",
                    f"{resume.killed_at_chunk:,}",
                    f"{resume.resumed_s:.1f}",
                    f"{resume.left_s:.1f}",
                    f"{resume.overhead_s:.1f}",
                    f"{resume.uninterrupted_s:.1f}",
                ]
            ],
        )
    print_json(
        "ingestions",
        args,
        [{**asdict(r), "chunks_per_second": r.rate} for r in rows],
        machine=machine,
        resume=(
            {**asdict(resume), "left_s": resume.left_s, "overhead_s": resume.overhead_s}
            if resume
            else None
        ),
    )


if __name__ == "__main__":
    main()
