"""Peak memory of a sync through the page loop, at 10,000 and at 100,000 records.

A local HTTP server (in this process) serves a GitHub-shaped issues endpoint: 100 issues a page,
``Link: <...>; rel="next"`` to the next one. Each sync runs in a fresh subprocess through the real
GitHub connector (``read()`` -> ``link_header_pages`` -> ``HttpClient``) and the engine's record
writer into Postgres; this process reads the child's peak RSS (``ru_maxrss`` from ``wait4``). If the
page loop held the table in memory, the peak would grow with the record count; it stays flat. A
control row runs the largest size with the connector's pages collected into one list first, to
show the measurement would see it if they were.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test python -m bench.page_loop_memory

Each child uses a schema of its own in that database and drops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
ROOT = Path(__file__).resolve().parent.parent
PER_PAGE = 100
SIZES = (10_000, 100_000)


# -- the provider --------------------------------------------------------------------------


def issue(n: int) -> dict[str, Any]:
    """An issue about the size of a real one (~1.5 KB of JSON)."""
    repo = "http://api.local/repos/bench/big"
    user = {
        "login": f"user{n % 97}",
        "id": 1000 + n % 97,
        "node_id": f"MDQ6VXNlcj{n % 97:06d}",
        "avatar_url": f"https://avatars.example/u/{1000 + n % 97}?v=4",
        "html_url": f"https://github.example/user{n % 97}",
        "type": "User",
        "site_admin": False,
    }
    return {
        "url": f"{repo}/issues/{n}",
        "repository_url": repo,
        "comments_url": f"{repo}/issues/{n}/comments",
        "events_url": f"{repo}/issues/{n}/events",
        "html_url": f"https://github.example/bench/big/issues/{n}",
        "id": 5_000_000 + n,
        "node_id": f"I_kwDOBench{n:010d}",
        "number": n,
        "title": f"Issue number {n}: something is not quite right in module {n % 31}",
        "user": user,
        "labels": [{"id": 208045946, "name": "bug", "color": "f29513", "default": True}],
        "state": "open" if n % 3 else "closed",
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": n % 7,
        "created_at": "2024-05-01T10:00:00Z",
        "updated_at": "2024-05-02T11:30:00Z",
        "closed_at": None if n % 3 else "2024-05-03T09:15:00Z",
        "author_association": "CONTRIBUTOR",
        "active_lock_reason": None,
        "body": f"Steps to reproduce #{n}:\n1. open the page\n2. click the button\n" * 3,
        "reactions": {"total_count": n % 5, "+1": n % 5, "-1": 0, "heart": 0},
        "timeline_url": f"{repo}/issues/{n}/timeline",
        "state_reason": None if n % 3 else "completed",
    }


class Provider(BaseHTTPRequestHandler):
    records = 0  # set per server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path.endswith("/pulls"):
            self._send([], None)
            return
        page = int(query.get("page", ["1"])[0])
        first = (page - 1) * PER_PAGE + 1
        last = min(page * PER_PAGE, self.records)
        body = [issue(n) for n in range(first, last + 1)]
        next_link = None
        if last < self.records:
            host = self.headers["Host"]
            next_link = f"http://{host}{url.path}?state=all&per_page={PER_PAGE}&page={page + 1}"
        self._send(body, next_link)

    def _send(self, body: Any, next_link: str | None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-ratelimit-remaining", "4999")
        if next_link:
            self.send_header("Link", f'<{next_link}>; rel="next"')
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per page would drown the table


@contextmanager
def provider(records: int) -> Iterator[str]:
    handler = type("SizedProvider", (Provider,), {"records": records})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()


# -- the child: one sync -------------------------------------------------------------------


def child(records: int, base_url: str, *, hold: bool) -> None:
    import psycopg
    from cryptography.fernet import Fernet

    from connectors.github import GitHubConnector
    from sync import Engine, Settings

    if hold:  # the control: what a page loop that kept the whole table would cost
        streaming = GitHubConnector.read
        GitHubConnector.read = lambda self, table: iter(list(streaming(self, table)))  # type: ignore[method-assign]

    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    schema = f"bench_mem_{uuid.uuid4().hex[:10]}"
    settings = Settings(
        database_url=url, schema_name=schema, secret_keys=Fernet.generate_key().decode()
    )
    try:
        with Engine(settings) as engine:
            engine.migrate()
            ws = engine.create_workspace("bench")
            conn = engine.create_connection(
                ws.id,
                "big",
                "github",
                config={"owner": "bench", "repos": ["big"], "base_url": base_url},
                credentials={"token": "bench-token"},
            )
            run = engine.sync(conn.id)
            worker = engine.worker(listen=False)
            started = time.perf_counter()
            while not run.is_terminal:
                worker.poll()
                run = engine.run(run.id)
            elapsed = time.perf_counter() - started
            worker.close()
            print(json.dumps({"status": run.status, "results": run.results, "seconds": elapsed}))
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(schema)
                )
            )


# -- the parent: measure each size -----------------------------------------------------------


def measure(records: int, *, hold: bool = False) -> dict[str, Any]:
    with provider(records) as base_url:
        command = [sys.executable, "-m", "bench.page_loop_memory", "--child", str(records)]
        process = subprocess.Popen(
            [*command, "--base-url", base_url, *(["--hold"] if hold else [])],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        output = process.stdout.read()
        # wait4, not wait: it hands back the child's own resource usage, peak RSS included.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"the {records:,}-record sync exited with {process.returncode}")
    outcome = json.loads(output.strip().splitlines()[-1])
    issues = outcome["results"]["issues"]
    if outcome["status"] != "succeeded" or issues["upserted"] != records:
        raise SystemExit(f"the {records:,}-record sync did not write every record: {outcome}")
    return {
        "what": "control: table held in a list" if hold else "page loop",
        "records": records,
        "pages": -(-records // PER_PAGE),
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
        "seconds": outcome["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--no-control", action="store_true", help="skip the control row")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON document on stdout (the table goes to stderr)",
    )
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.base_url, hold=args.hold)
        return
    # Only the parent imports the shared bench helpers (rich among them): the child's peak RSS
    # is the measurement.
    from bench.common import machine_info, print_json

    machine = machine_info(None)
    rows = [measure(n) for n in args.sizes]
    control = None if args.no_control else measure(max(args.sizes), hold=True)
    out = sys.stderr if args.json else sys.stdout
    print(
        f"page loop memory: GitHub connector -> engine writer, {PER_PAGE} records a page", file=out
    )
    print(
        f"{'':<30} {'records':>10} {'pages':>6} {'peak RSS':>10} {'sync time':>10} "
        f"{'records/s':>10}",
        file=out,
    )
    for row in [*rows, *([control] if control else [])]:
        row["records_per_s"] = row["records"] / row["seconds"]
        print(
            f"{row['what']:<30} {row['records']:>10,} {row['pages']:>6,} "
            f"{row['peak_rss_mib']:>7.1f} MiB {row['seconds']:>8.1f} s "
            f"{row['records_per_s']:>10,.0f}",
            file=out,
        )
    growth = rows[-1]["peak_rss_mib"] - rows[0]["peak_rss_mib"]
    print(
        f"page loop: peak RSS grew {growth:+.1f} MiB from {rows[0]['records']:,} to "
        f"{rows[-1]['records']:,} records ({rows[-1]['records'] // rows[0]['records']}x the data)",
        file=out,
    )
    if control:
        extra = control["peak_rss_mib"] - rows[-1]["peak_rss_mib"]
        print(
            f"control: holding the {control['records']:,} records costs {extra:+.1f} MiB more",
            file=out,
        )
    print_json(
        "page_loop_memory",
        args,
        [*rows, *([control] if control else [])],
        machine=machine,
        growth_mib=growth,
    )


if __name__ == "__main__":
    main()
