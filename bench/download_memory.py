"""Peak memory of ``HttpClient.download`` for files of 5, 50 and 200 MB.

    python -m bench.download_memory [--sizes 5,50,200] [--json]

A local server (threads of this process) mimics Microsoft Graph's ``/content``: the API port
answers ``302 Found`` with a Location on a second port, which streams the file in 1 MiB blocks
and refuses a request that carries an ``Authorization`` header. Each download runs in a fresh
process, through the connectors' ``HttpClient`` with a bearer token, into a temporary file;
that process reports its peak RSS (``VmHWM``) after its imports and after the download. If the
download held the body, the peak would grow with the file; it stays flat. A control row reads
the largest file with ``HttpClient.get`` (the whole body in memory) to show the measurement
would see it. No database is needed.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import Column, print_table, python, spawn

MB = 1024 * 1024
BLOCK = bytes(range(256)) * (MB // 256)


def _rss_mb() -> float:
    """This process's peak RSS so far (``VmHWM``: it belongs to the address space, which exec
    replaces, unlike ``ru_maxrss``, which carries the parent's peak over fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the provider --------------------------------------------------------------------------


class _Api(BaseHTTPRequestHandler):
    downloads_port: int

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        size = self.path.strip("/").split("/")[1]  # /files/SIZE/content
        self.send_response(302)
        self.send_header("Location", f"http://127.0.0.1:{self.downloads_port}/blob/{size}")
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Blobs(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization"):
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = int(self.path.rsplit("/", 1)[1])
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        left = size
        while left:
            block = BLOCK[: min(left, len(BLOCK))]
            self.wfile.write(block)
            left -= len(block)


@contextmanager
def serving() -> Iterator[str]:
    blobs = ThreadingHTTPServer(("127.0.0.1", 0), _Blobs)
    api_handler = type("Api", (_Api,), {"downloads_port": blobs.server_address[1]})
    api = ThreadingHTTPServer(("127.0.0.1", 0), api_handler)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (api, blobs)]
    for thread in threads:
        thread.start()
    try:
        yield f"http://127.0.0.1:{api.server_address[1]}"
    finally:
        for server in (api, blobs):
            server.shutdown()
            server.server_close()


# -- the child -----------------------------------------------------------------------------


def child(url: str, size: int, whole: bool) -> None:
    from connectors import BearerToken, HttpClient, NoConfig
    from connectors.testing import FakeContext

    context = FakeContext(config=NoConfig())
    baseline = _rss_mb()
    started = time.perf_counter()
    auth = BearerToken("bench-token")
    # max_body_bytes bounds only bodies read into memory: the control's.
    with HttpClient(context, base_url=url, auth=auth, max_body_bytes=size + 1) as http:
        if whole:
            received = len(http.get(f"/files/{size}/content").content)
        else:
            with tempfile.TemporaryFile() as out:
                received = http.download(f"/files/{size}/content", out, max_bytes=size).size
    seconds = time.perf_counter() - started
    assert received == size, (received, size)
    print(json.dumps({"baseline_mb": baseline, "peak_mb": _rss_mb(), "seconds": seconds}))


def _run_child(url: str, size: int, whole: bool) -> dict[str, float]:
    args = [python(), "-m", "bench.download_memory", "--child", url, "--size", str(size)]
    process = spawn([*args, *(["--whole"] if whole else [])])
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"the download child failed ({process.returncode})")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,50,200", help="file sizes in MB")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.whole)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    with serving() as url:
        runs: list[tuple[int, str, Callable[[], dict[str, float]]]] = [
            (mb, "download", lambda mb=mb: _run_child(url, mb * MB, False)) for mb in sizes
        ]
        runs.append((sizes[-1], "get (control)", lambda: _run_child(url, sizes[-1] * MB, True)))
        for mb, how, run in runs:
            result = run()
            rows.append({"size_mb": mb, "how": how, **result})
    if args.json:
        print(json.dumps(rows))
        return
    print_table(
        "HttpClient.download: peak RSS of a fresh process (302 to another port, then 200)",
        [Column("file", "right"), Column("read by", "left"), "after imports", "peak", "MB/s"],
        [
            (
                f"{r['size_mb']} MB",
                r["how"],
                f"{r['baseline_mb']:.1f} MB",
                f"{r['peak_mb']:.1f} MB",
                f"{r['size_mb'] / r['seconds']:.0f}",
            )
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
