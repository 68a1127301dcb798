"""Document indexing: chunks per second and peak memory for text files of 5, 50 and 500 MB.

    python -m bench.documents [--sizes 5,50,500] [--peer-max-mb 50] [--searches 5] [--json]

Each file is indexed by a fresh process, as an ingestion job would index it: the file is read as
a stream and spooled to a temporary file; a first pass extracts and chunks it to count its
chunks (the job's ``total_units``); a second pass extracts and chunks it again, embeds each
batch of 200 chunks with the default hashing embedder and upserts the batch into the real
Postgres, one transaction per batch. Reported: chunks/s of the count pass and of the whole
(second) pass, and the process's peak RSS (``VmHWM``) next to its peak once its imports were
done: it must stay flat from 5 MB to 500 MB. Then a few searches of that file's workspace.

Compared in the same run with LangChain's ``RecursiveCharacterTextSplitter`` (the splitter most
pipelines use; same chunk size and overlap), which splits a string: its process reads the file
whole, so its memory grows with the file. It only splits (no embedding, no database): compare
it with our count pass. It runs up to ``--peer-max-mb`` (it needs ``pip install -e
'.[bench]'``).

The files are generated English-like text (a fixed vocabulary, sentences and paragraphs from a
seeded generator): 8 MB of distinct text, repeated to the size with each repetition numbered.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import (
    Column,
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
    spawn,
)

MB = 1024 * 1024
BATCH = 200
DISTINCT = 8 * MB
QUERIES = ("steel beam revision", "schedule concrete pour", "fire door hardware", "guardrail")


@dataclass
class Row:
    size_mb: int
    system: str
    chunks: int
    count_s: float | None  # extract + chunk only
    index_s: float | None  # extract + chunk + embed + upsert
    rss_start_mb: float
    rss_peak_mb: float
    search_ms: float | None = None

    @property
    def count_rate(self) -> float | None:
        return self.chunks / self.count_s if self.count_s else None

    @property
    def index_rate(self) -> float | None:
        return self.chunks / self.index_s if self.index_s else None


# -- the corpus ----------------------------------------------------------------------------


def _vocabulary(rng: random.Random) -> list[str]:
    common = " ".join(
        (
            "the of and to in is for on with as by at from that this be are was it an or which",
            "steel beam concrete pour schedule fire door hardware guardrail inspection level",
            "drawing revision section specification contractor site crane weld bolt slab deck",
        )
    ).split()
    letters = "abcdefghijklmnopqrstuvwxyz"
    made = ["".join(rng.choices(letters, k=rng.randint(3, 11))) for _ in range(6000)]
    return common * 40 + made


def write_corpus(path: Path, size: int) -> None:
    """``size`` bytes of text: 8 MB of distinct paragraphs, repeated, each repetition numbered."""
    rng = random.Random(20261201)
    words = _vocabulary(rng)
    paragraphs: list[str] = []
    length = 0
    while length < DISTINCT:
        sentences = []
        for _ in range(rng.randint(3, 8)):
            sentence = " ".join(rng.choices(words, k=rng.randint(8, 24)))
            sentences.append(sentence[0].upper() + sentence[1:] + ".")
        paragraph = " ".join(sentences) + "\n\n"
        paragraphs.append(paragraph)
        length += len(paragraph)
    block = "".join(paragraphs).encode()
    written = 0
    with path.open("wb") as out:
        for n in itertools.count(1):
            piece = f"Part {n}.\n\n".encode() + block
            piece = piece[: size - written]
            out.write(piece)
            written += len(piece)
            if written >= size:
                break


# -- the children --------------------------------------------------------------------------


def _rss_mb() -> float:
    """This process's peak RSS so far. Not ``ru_maxrss``: on Linux that carries the parent's
    peak over fork and exec, so a child started by a large parent reports the parent's size.
    ``VmHWM`` belongs to the address space, which exec replaces."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_ours(url: str, file: str, workspace: int) -> None:
    from sync.documents import (
        DocumentLimits,
        DocumentStore,
        Extraction,
        HashingEmbedder,
        MediaType,
        chunks,
        spool,
    )

    start_rss = _rss_mb()
    limits = DocumentLimits()
    embedder = HashingEmbedder()
    with Path(file).open("rb") as stream:
        spooled = spool(stream, max_bytes=limits.max_bytes, name=file)
    with spooled, connect(url) as conn:
        began = time.perf_counter()
        total = sum(1 for _ in chunks(Extraction(spooled.path, MediaType.TEXT, limits), limits))
        count_s = time.perf_counter() - began
        store = DocumentStore(conn)
        document = store.add_document(workspace, Path(file).name, MediaType.TEXT)
        began = time.perf_counter()
        made = chunks(Extraction(spooled.path, MediaType.TEXT, limits), limits)
        while batch := list(itertools.islice(made, BATCH)):
            vectors = embedder.embed([c.text for c in batch])
            with conn.transaction():
                # As the engine's record writer does for a run's intermediate writes (see
                # "Durability" in docs/architecture.md); the job's finish commits synchronously.
                conn.execute("SELECT set_config('synchronous_commit', 'off', true)")
                store.upsert_chunks(document, batch, vectors, model=embedder.model)
        index_s = time.perf_counter() - began
    print(
        json.dumps(
            {
                "chunks": total,
                "count_s": count_s,
                "index_s": index_s,
                "rss_start_mb": start_rss,
                "rss_peak_mb": _rss_mb(),
            }
        ),
        flush=True,
    )


def child_langchain(file: str) -> None:
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    from sync.documents import DocumentLimits

    start_rss = _rss_mb()
    limits = DocumentLimits()
    splitter = RecursiveCharacterTextSplitter(
        chunk_size=limits.chunk_chars, chunk_overlap=limits.chunk_overlap
    )
    began = time.perf_counter()
    pieces = splitter.split_text(Path(file).read_text())
    seconds = time.perf_counter() - began
    print(
        json.dumps(
            {
                "chunks": len(pieces),
                "count_s": seconds,
                "index_s": None,
                "rss_start_mb": start_rss,
                "rss_peak_mb": _rss_mb(),
            }
        ),
        flush=True,
    )


def _run_child(args: list[str]) -> dict[str, float]:
    proc = spawn([python(), "-m", "bench.documents", *args])
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench.documents {args[0]} failed (exit {proc.returncode})")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _search_ms(url: str, workspace: int, rounds: int) -> float | None:
    if rounds < 1:
        return None
    from sync.documents import DocumentStore, HashingEmbedder

    embedder = HashingEmbedder()
    times = []
    with connect(url) as conn:
        store = DocumentStore(conn)
        for query in itertools.islice(itertools.cycle(QUERIES), rounds):
            began = time.perf_counter()
            store.search(workspace, query, embedder)
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


# -- the run -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,50,500", help="file sizes in MB (5,50,500)")
    parser.add_argument("--peer-max-mb", type=int, default=50, help="largest file for LangChain")
    parser.add_argument("--searches", type=int, default=5, help="searches per file (median)")
    add_json_option(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--workspace", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "ours":
        child_ours(args.url, args.file, args.workspace)
        return
    if args.child == "langchain":
        child_langchain(args.file)
        return

    json_mode(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[Row] = []
    with scratch_database("documents") as url, tempfile.TemporaryDirectory() as workdir:
        console.print(f"[bold]bench.documents[/bold]: {', '.join(f'{s} MB' for s in sizes)}")
        machine = machine_info(url)
        console.print(machine_line(machine))
        migrate(url)
        for size in sizes:
            file = Path(workdir) / f"corpus-{size}mb.txt"
            write_corpus(file, size * MB)
            with connect(url) as conn:
                row = conn.execute(
                    "INSERT INTO workspaces (name) VALUES (%s) RETURNING id", (f"docs-{size}",)
                ).fetchone()
            assert row is not None
            workspace = int(row[0])
            ours = _run_child(
                [
                    "--child",
                    "ours",
                    "--url",
                    url,
                    "--file",
                    str(file),
                    "--workspace",
                    str(workspace),
                ]
            )
            rows.append(_show(Row(size, "connector-sync", **ours)))  # type: ignore[arg-type]
            rows[-1].search_ms = _search_ms(url, workspace, args.searches)
            if size <= args.peer_max_mb:
                peer = _run_child(["--child", "langchain", "--file", str(file)])
                rows.append(_show(Row(size, "LangChain splitter", **peer)))  # type: ignore[arg-type]
            file.unlink()
    report(rows)
    print_json(
        "documents",
        args,
        [{**asdict(r), "count_rate": r.count_rate, "index_rate": r.index_rate} for r in rows],
        machine=machine,
    )


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _show(row: Row) -> Row:
    console.print(
        f"  {row.size_mb:>4} MB {row.system:20} {row.chunks:>9,} chunks  "
        f"count {_fmt(row.count_rate)}/s  index {_fmt(row.index_rate)}/s  "
        f"RSS {row.rss_start_mb:.0f} -> {row.rss_peak_mb:.0f} MB"
    )
    return row


def report(rows: list[Row]) -> None:
    print_table(
        f"Text documents indexed (chunks of 1,000 characters, overlap 150; batches of {BATCH})",
        [
            "MB",
            Column("system", "left"),
            "chunks",
            "chunk only /s",
            "indexed /s",
            "indexing s",
            "RSS after imports MB",
            "peak RSS MB",
            "search ms (median)",
        ],
        [
            [
                r.size_mb,
                r.system,
                f"{r.chunks:,}",
                _fmt(r.count_rate),
                _fmt(r.index_rate),
                _fmt(r.index_s, ",.1f"),
                f"{r.rss_start_mb:,.0f}",
                f"{r.rss_peak_mb:,.0f}",
                _fmt(r.search_ms, ",.1f"),
            ]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
