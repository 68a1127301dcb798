"""The figures tables of docs/performance.md, made from the benchmarks' committed results.

    python -m bench.report           # every table, under the marker the doc holds it under
    python -m bench.report --write   # the same tables, written into docs/performance.md

``bench/results/<script>.json`` is what ``python -m bench.<script> --json`` printed, unedited.
To update a figure, run its benchmark again into that file, then ``--write``;
``tests/test_performance_doc.py`` fails while a table of the doc differs from this script's.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "performance.md"
# A table in the doc: its marker, then its lines up to the first that is not a table row.
BLOCK = re.compile(r"(<!-- table: ([a-z_]+) -->\n)((?:\|.*\n)*)")
# A cell that is a figure: a number, a ratio, a range, a pair or a sum; "-" is a missing one.
FIGURE = re.compile(r"\**-?[\d,.]+x?( ?[-/+] ?-?[\d,.]+x?)*\**|-")


def result(script: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{script}.json").read_text())


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table whose columns of figures are aligned right."""
    cells = [[str(cell) for cell in row] for row in rows]
    right = [all(FIGURE.fullmatch(row[i]) for row in cells if row[i]) for i in range(len(header))]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---:" if r else "---" for r in right) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def times(value: float | None, reference: float | None) -> str:
    return "-" if value is None or not reference else f"{value / reference:.2f}x"


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


# -- one function per table ----------------------------------------------------------------


def runs() -> str:
    """Which run of which script each table comes from, and the load it met."""
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        doc = result(path.stem)
        rows.append(
            [
                f"`bench.{doc['bench']}`",
                f"`{doc['commit']}`",
                doc["finished_at"][:16].replace("T", " "),
                " / ".join(f"{x:.2f}" for x in doc["machine"]["load_average"]),
            ]
        )
    return markdown(["script", "commit", "finished (UTC)", "load 1 / 5 / 15 min"], rows)


def claim() -> str:
    rows = result("claim")["results"]
    reference = next(
        r["jobs_per_s"]
        for r in rows
        if (r["system"], r["configuration"]) == ("graphile-worker", "concurrency 1")
    )
    return markdown(
        ["system", "configuration", "procs", "jobs/s", "range", "x graphile-worker, one at a time"],
        (
            [
                r["system"],
                r["configuration"],
                r["processes"],
                num(r["jobs_per_s"]),
                "-".join(num(f(r["jobs_per_s_each_repeat"])) for f in (min, max)),
                times(r["jobs_per_s"], reference),
            ]
            for r in rows
        ),
    )


def round_trips() -> str:
    traces = result("claim")["round_trips_per_run"]
    counts = [t["by_statement"] for t in traces.values()]
    shown = [
        name
        for name in dict.fromkeys(name for c in counts for name in c)
        if any(c.get(name, 0) >= 0.5 for c in counts)
    ]
    rows = [[f"`{name}`", *(f"{c.get(name, 0):.2f}" for c in counts)] for name in shown]
    rest = [sum(c.values()) - sum(c.get(name, 0) for name in shown) for c in counts]
    rows.append(["anything else (start, prepares, idle polls)", *(f"{x:.2f}" for x in rest)])
    rows.append(["**in all**", *(f"**{sum(c.values()):.2f}**" for c in counts)])
    return markdown(["round trips per run", *traces], rows)


def latency() -> str:
    return markdown(
        [
            "system",
            "configuration: start mark",
            "n",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "p50 ms after the enqueue returned",
            "enqueue p50 ms",
        ],
        (
            [
                r["system"],
                r["configuration"],
                r["n"],
                num(r["p50_ms"], 2),
                num(r["p95_ms"], 2),
                num(r["p99_ms"], 2),
                num(r["p50_ms_from_enqueue_return"], 2),
                num(r["enqueue_p50_ms"], 2),
            ]
            for r in result("latency")["results"]
        ),
    )


def records() -> str:
    rows = result("records")["results"]
    copy = {r["size"]: r["records_per_s"] for r in rows if r["system"].startswith("COPY (")}
    return markdown(
        [
            "records",
            "system",
            "phase",
            "records/s",
            "x COPY",
            "WAL MB",
            "of it page images MB",
            "worker peak RSS MB",
            "rows written / unchanged / tombstoned",
        ],
        (
            [
                num(r["size"]),
                r["system"],
                r["phase"],
                num(r["records_per_s"]),
                times(r["records_per_s"], copy[r["size"]]),
                mb(r["wal_db"]),
                mb(r["wal_fpi"]),
                num(r["rss_kb"] / 1024) if r["system"] == "connector-sync" else "-",
                r["counts"].replace(" up", "").replace(" same", "").replace(" tomb", ""),
            ]
            for r in rows
        ),
    )


def resync_requests() -> str:
    """Requests per table and sync ("answered 304": conditional requests answered Not Modified;
    "item": a request about one missing row), and the rows the last sync tombstoned."""
    syncs = ["first sync", "resync, nothing changed", "resync after 1 % deleted"]
    kinds = {"": "{}", " (304)": "{} answered 304", " (item)": "{} item"}
    rows = []
    for case, by_sync in result("resync_requests")["results"].items():
        deleted = by_sync[syncs[2]]
        tombstoned = f"{deleted['rows tombstoned']} of {deleted['rows deleted upstream']}"
        names = {name.split(" (")[0] for counts in by_sync.values() for name in counts}
        for table in sorted(names - {"rows deleted upstream", "rows tombstoned"}):
            requests = [
                " + ".join(
                    form.format(by_sync[s][table + kind])
                    for kind, form in kinds.items()
                    if by_sync[s].get(table + kind)
                )
                or "0"
                for s in syncs
            ]
            rows.append([case, f"`{table}`", *requests, tombstoned])
            case, tombstoned = "", ""
    return markdown(["connector", "table", *syncs, "rows tombstoned, of those deleted"], rows)


def scale() -> str:
    rows = [
        [r["history"], num(r["p50_ms"], 3), num(r["p95_ms"], 3), r["buffers_per_claim"]]
        for r in result("scale")["results"]
    ]
    return markdown(["queue", "p50 ms", "p95 ms", "buffers per claim"], rows)


def unserved() -> str:
    return markdown(
        [
            "runs ahead the worker cannot take",
            "p50 ms",
            "p95 ms",
            "p50 ms, a worker that can take them",
        ],
        (
            [
                num(r["unserved_ahead"]),
                num(r["lacking_p50_ms"], 3),
                num(r["lacking_p95_ms"], 3),
                num(r["having_p50_ms"], 3),
            ]
            for r in result("unserved")["results"]
        ),
    )


def fleet() -> str:
    points = result("fleet")["results"]
    counts = sorted({p["workers"] for p in points})

    def cells(mix: str, what: Callable[[dict[str, Any]], str]) -> list[str]:
        by = {p["workers"]: p for p in points if p["mix"] == mix}
        return [what(by[n]) if n in by and not by[n]["error"] else "-" for n in counts]

    def latency(p: dict[str, Any]) -> str:
        ms = p["load"]["latency_ms"]
        return "-" if ms is None else f"{ms['p50']:.1f} / {ms['p95']:.1f}"

    def cpu(p: dict[str, Any]) -> str:
        d = p["drain"]
        return f"{d['worker_cpu_ms_per_run']:.1f} + {d['postgres_cpu_ms_per_run']:.1f}"

    def rate(p: dict[str, Any]) -> str:
        return num(p["drain"]["runs_per_s"])

    rows = []
    for mix in ("many workspaces", "4 workspaces x 8 providers"):
        rows += [
            [f"ours, {mix}: runs/s", *cells(mix, rate)],
            ["… enqueue-to-start p50 / p95 ms", *cells(mix, latency)],
            ["… CPU ms per run, workers + Postgres", *cells(mix, cpu)],
            [
                "… empty claims per run",
                *cells(mix, lambda p: f"{p['load']['empty_claims_per_run']:.1f}"),
            ],
        ]
    rows.append(["bare SQL loop: runs/s", *cells("-", rate)])
    return markdown(["workers", *(str(n) for n in counts)], rows)


def retention() -> str:
    doc = result("retention")["results"]
    prune = doc["prune"]
    runs, attempts = prune["deleted"]["runs"], prune["deleted"]["attempts"]
    during = (
        f"during the prune ({runs:,} runs and {attempts:,} attempts deleted in "
        f"{prune['seconds']:.0f} s, {prune['statements']:,} statements)"
    )
    return markdown(
        ["claims", "claims/s", "p50 ms", "p95 ms", "max ms"],
        (
            [
                during if c["phase"] == "during the prune" else c["phase"],
                num(c["claims_per_s"]),
                num(c["p50_ms"], 2),
                num(c["p95_ms"], 2),
                num(c["max_ms"], 1),
            ]
            for c in doc["claims"]
        ),
    )


def pooler() -> str:
    rows = result("pooler")["results"]
    direct = {r["workers"]: r["drain_runs_per_s"] for r in rows if r["setup"] == "direct"}
    return markdown(
        [
            "set-up",
            "workers",
            "drain runs/s",
            "x direct",
            "p95 enqueue-to-start ms",
            "Postgres backends",
        ],
        (
            [
                r["setup"],
                r["workers"],
                num(r["drain_runs_per_s"]),
                times(r["drain_runs_per_s"], direct.get(r["workers"])),
                num(r["p95_start_ms"]),
                r["backends"],
            ]
            for r in rows
        ),
    )


def metrics() -> str:
    return markdown(
        [
            "finished runs",
            "`metrics_snapshot` ms",
            "the whole history ms",
            "connections page (1,000) ms",
        ],
        (
            [
                num(r["finished_runs"]),
                num(r["snapshot_ms"], 1),
                num(r["whole_history_ms"]),
                num(r["connections_overview_ms"], 1),
            ]
            for r in result("metrics")["results"]
        ),
    )


def document_search() -> str:
    return markdown(
        ["chunks", "storage", "`search()` ms", "exact vector scan ms", "µs per chunk"],
        (
            [
                num(r["chunks"]),
                r["storage"],
                num(r["search_ms"], 1),
                num(r["scan_ms"], 1),
                num(1000 * r["scan_ms"] / r["chunks"], 2),
            ]
            for r in result("document_search")["results"]
        ),
    )


def typed_views() -> str:
    doc = result("typed_views")
    n = doc["options"]["n"]
    rows = [
        [
            r["query"],
            num(n),
            num(r["view_ms"], 1),
            num(r["plain_view_ms"], 1),
            num(r["table_ms"], 1),
            times(r["view_ms"], r["table_ms"]),
        ]
        for r in doc["results"]
    ]
    return markdown(
        ["query", "rows", "typed view ms", "no barrier ms", "typed table ms", "view / table"],
        rows,
    )


def typed_views_typing() -> str:
    doc = result("typed_views")
    cost, options = doc["typing"], doc["options"]
    return markdown(
        ["measure", "records", "with typed views", "without", "with / without"],
        [
            [
                "observing, or encoding, µs per record",
                num(options["typing_n"]),
                num(cost["observe_us"], 2),
                f"{cost['encode_us']:.2f} (encoding)",
                times(cost["observe_us"], cost["encode_us"]),
            ],
            [
                "a first sync in one process, records/s",
                num(options["sync_n"]),
                num(cost["with_per_s"]),
                num(cost["without_per_s"]),
                times(cost["with_per_s"], cost["without_per_s"]),
            ],
        ],
    )


TABLES: dict[str, Callable[[], str]] = {
    "runs": runs,
    "claim": claim,
    "round_trips": round_trips,
    "latency": latency,
    "records": records,
    "resync_requests": resync_requests,
    "scale": scale,
    "unserved": unserved,
    "fleet": fleet,
    "retention": retention,
    "pooler": pooler,
    "metrics": metrics,
    "document_search": document_search,
    "typed_views": typed_views,
    "typed_views_typing": typed_views_typing,
}


def tables() -> dict[str, str]:
    return {name: make() for name, make in TABLES.items()}


def in_doc(text: str) -> dict[str, str]:
    """The tables a document holds under their markers, by name."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def written(text: str) -> str:
    """``text`` with every marked table replaced by this script's."""
    made = tables()
    return BLOCK.sub(lambda m: m.group(1) + made[m.group(2)], text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write them into {DOC.name}")
    args = parser.parse_args()
    if args.write:
        DOC.write_text(written(DOC.read_text()))
        return
    for name, table in tables().items():
        print(f"<!-- table: {name} -->\n{table}")


if __name__ == "__main__":
    main()
