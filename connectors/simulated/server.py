"""The simulated provider's HTTP server: a small server on 127.0.0.1 that behaves like a SaaS API
worth syncing. It pages, answers some requests with 429 + Retry-After or 503, refuses a wrong
token with 401, and serves the tenants of a :class:`Simulation` (``tenants``), whose data changes
between syncs: each call to :meth:`Tenant.advance` (or ``POST /_control/tenants/NAME/advance``)
moves a tenant to its next *generation*, adding, updating and deleting a seeded, reproducible set
of rows.

Each tenant (one customer account) has three APIs:

- a project tracker (provider ``simulated``): ``/tracker/TENANT/projects`` and ``.../issues``,
  paged by ``page``/``per_page`` with an RFC 8288 ``Link: <...>; rel="next"`` header and the
  count in ``X-Total-Count``, and one row by id (``.../issues/ID``, 404 once it is deleted);
- a CRM (provider ``simulated_crm``): ``/crm/TENANT/contacts``, paged by an opaque ``cursor``
  returned as ``next_cursor`` in the body (one contact by id at ``.../contacts/ID``), and
  ``/crm/TENANT/deals/changes?since=GENERATION``, an incremental feed of changed rows and
  deletions;
- a document store (provider ``simulated_docs``): ``/docs/TENANT/files``, paged like the
  tracker, each file in a project; ``.../files/ID/content`` answers 302 to a pre-authenticated
  download URL served on a second port (another origin, which refuses an ``Authorization``
  header, as presigned-URL stores do), or the content itself when redirects are turned off.

Start it in-process with :func:`start_server` (tests, the demo) or from a shell with
``python -m connectors.simulated.server``. The full API is in docs/simulated-provider.md.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from connectors.simulated.documents import Document
from connectors.simulated.tenants import (
    DOCS_TABLES,
    TRACKER_TABLES,
    Simulation,
    Tenant,
    default_simulation,
)

MAX_PAGE_SIZE = 500


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def _int_param(query: dict[str, list[str]], name: str, default: int | None) -> int | None:
    values = query.get(name)
    if not values:
        return default
    try:
        return int(values[-1])
    except ValueError:
        raise _HTTPError(400, f"query parameter {name!r} must be an integer") from None


def _page_size(query: dict[str, list[str]], name: str) -> int:
    size = _int_param(query, name, 25)
    assert size is not None
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise _HTTPError(400, f"{name} must be between 1 and {MAX_PAGE_SIZE}")
    return size


def _encode_cursor(kind: str, *values: int) -> str:
    """An opaque cursor: ``o`` (an offset) for listings, ``f`` (the last id shown and the
    generation the feed started at) for the change feed."""
    text = ":".join([kind, *map(str, values)])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, kind: str, count: int) -> list[int]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        found, *values = text.split(":")
        if found != kind or len(values) != count:
            raise ValueError(text)
        return [int(v) for v in values]
    except ValueError:
        raise _HTTPError(400, "the cursor is not one this API returned") from None


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


class _Handler(BaseHTTPRequestHandler):
    server_version = "simulated-provider/1"
    simulation: Simulation  # set on the subclass made per server
    downloads_port: int  # the download server's port, set likewise

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the demo and the tests read the tenants' stats instead."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        segments = [s for s in parts.path.split("/") if s]
        query = parse_qs(parts.query)
        try:
            if segments[:1] == ["_control"]:
                status, body, headers = self._control(method, segments[1:])
            elif method == "GET" and segments[:1] in (["tracker"], ["crm"], ["docs"]):
                status, body, headers = self._data(segments, query)
            else:
                raise _HTTPError(404, f"no such endpoint: {method} {parts.path}")
        except _HTTPError as exc:
            status, body, headers = exc.status, {"error": exc.message}, exc.headers
        self._send(status, body, headers)

    def _send(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        """Send ``body`` as JSON, or as it is when it is bytes (its headers say what it is)."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        if not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    # -- the provider's APIs ---------------------------------------------------------------

    def _data(
        self, segments: list[str], query: dict[str, list[str]]
    ) -> tuple[int, Any, dict[str, str]]:
        api, tenant_name, rest = segments[0], segments[1] if len(segments) > 1 else "", segments[2:]
        tenant = self.simulation.get(tenant_name)
        if tenant is None:
            raise _HTTPError(404, f"no tenant {tenant_name!r}")
        if self.headers.get("Authorization") != f"Bearer {tenant.token}":
            tenant.count("unauthorized")
            raise _HTTPError(401, "missing or wrong bearer token")
        route = "/".join(rest)
        known, by_id = {
            "tracker": (TRACKER_TABLES, TRACKER_TABLES),
            "crm": (("contacts", "deals/changes"), ("contacts",)),
            "docs": (DOCS_TABLES, DOCS_TABLES),
        }[api]
        item = len(rest) == 2 and rest[0] in by_id
        content = api == "docs" and len(rest) == 3 and rest[0] == "files" and rest[2] == "content"
        if route not in known and not item and not content:
            tenant.count("not_found")
            raise _HTTPError(404, f"no such endpoint: /{api}/{tenant_name}/{route}")
        tenant.note_request(self.path.split("/", 3)[-1])
        fault = tenant.fault_for_next_request(api)
        if fault == "budget":
            raise _HTTPError(
                429,
                "rate limit exceeded for this window",
                {"Retry-After": _format_seconds(tenant.faults.window)},
            )
        if fault == "429":
            raise _HTTPError(
                429,
                "rate limit exceeded",
                {"Retry-After": _format_seconds(tenant.faults.retry_after)},
            )
        if fault == "503":
            raise _HTTPError(503, "service unavailable, try again")
        if fault == "401":
            raise _HTTPError(401, "the token was revoked")
        if tenant.page_delay:
            time.sleep(tenant.page_delay)
        if content:
            return self._content(tenant, rest[1])
        if item:
            try:
                row_id = int(rest[1])
            except ValueError:
                raise _HTTPError(404, f"no {rest[0]} {rest[1]!r}") from None
            found = tenant.row(rest[0], row_id)
            if found is None:
                tenant.count("not_found")
                raise _HTTPError(404, f"no {rest[0]} {row_id}: it does not exist or was deleted")
            return 200, found, {}
        if api in ("tracker", "docs"):
            return self._linked_page(tenant, api, route, query)
        cursor = query.get("cursor")
        if route == "contacts":
            size = _page_size(query, "limit")
            [offset] = _decode_cursor(cursor[-1], "o", 1) if cursor else [0]
            rows, more, _ = tenant.page("contacts", offset, size)
            next_cursor = _encode_cursor("o", offset + size) if more else None
            return 200, {"data": rows, "next_cursor": next_cursor}, {}
        size = _page_size(query, "limit")
        after, started_at = _decode_cursor(cursor[-1], "f", 2) if cursor else (0, None)
        since = _int_param(query, "since", None)
        rows, more, generation = tenant.changes("deals", since, after, size, started_at)
        next_cursor = _encode_cursor("f", rows[-1]["id"], generation) if more else None
        return 200, {"data": rows, "next_cursor": next_cursor, "generation": generation}, {}

    def _content(self, tenant: Tenant, raw_id: str) -> tuple[int, Any, dict[str, str]]:
        """A file's content, or (when the tenant redirects) a 302 to its download URL on the
        download server, which is another origin: a client must not send it the token."""
        file_id = int(raw_id) if raw_id.isdigit() else 0
        document = tenant.content(file_id)
        if document is None:
            tenant.count("not_found")
            raise _HTTPError(404, f"no file {raw_id!r}: it does not exist or was deleted")
        if tenant.content_redirect:
            host = urlsplit(f"//{self.headers.get('Host') or '127.0.0.1'}").hostname or "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
            location = f"http://{host}:{self.downloads_port}{tenant.download_path(file_id)}"
            return 302, b"", {"Location": location}
        tenant.count("downloads")
        return 200, document.content, _content_headers(document)

    def _linked_page(
        self, tenant: Tenant, api: str, table: str, query: dict[str, list[str]]
    ) -> tuple[int, Any, dict[str, str]]:
        size = _page_size(query, "per_page")
        page = _int_param(query, "page", 1)
        assert page is not None
        if page < 1:
            raise _HTTPError(400, "page starts at 1")
        rows, more, count = tenant.page(table, (page - 1) * size, size)
        headers = {"X-Total-Count": str(count)}
        if more:
            host = self.headers.get("Host") or "127.0.0.1"
            params = urlencode({"page": page + 1, "per_page": size})
            headers["Link"] = f'<http://{host}/{api}/{tenant.name}/{table}?{params}>; rel="next"'
        return 200, rows, headers

    # -- control ---------------------------------------------------------------------------

    def _control(self, method: str, segments: list[str]) -> tuple[int, Any, dict[str, str]]:
        if segments == ["tenants"] and method == "GET":
            return 200, {"tenants": [t.describe() for t in self.simulation.tenants()]}, {}
        if len(segments) < 2 or segments[0] != "tenants":
            raise _HTTPError(404, "control endpoints live under /_control/tenants")
        name, action = segments[1], segments[2:]
        if method == "PUT" and not action:
            body = self._json_body()
            try:
                tenant = self.simulation.add_tenant(
                    name,
                    token=body.get("token"),
                    size=int(body.get("size", 100)),
                    seed=int(body.get("seed", 1)),
                    page_delay=float(body.get("page_delay", 0.0)),
                )
            except (TypeError, ValueError) as exc:
                raise _HTTPError(400, str(exc)) from None
            return 201, tenant.describe(), {}
        found = self.simulation.get(name)
        if found is None:
            raise _HTTPError(404, f"no tenant {name!r}")
        tenant = found
        if method == "GET" and not action:
            return 200, tenant.describe(), {}
        if method == "POST" and action == ["advance"]:
            return 200, {"generation": tenant.generation + 1, "changes": tenant.advance()}, {}
        if method == "PATCH" and not action:
            body = self._json_body()
            try:
                if "script" in body:
                    tenant.script_faults(*[str(f) for f in body["script"]])
                tenant.configure(
                    rate_limit_every=body.get("rate_limit_every"),
                    unavailable_every=body.get("unavailable_every"),
                    retry_after=body.get("retry_after"),
                    page_delay=body.get("page_delay"),
                    content_redirect=body.get("content_redirect"),
                )
            except (TypeError, ValueError) as exc:
                raise _HTTPError(400, str(exc)) from None
            return 200, tenant.describe(), {}
        raise _HTTPError(404, f"no such control endpoint: {method} /{'/'.join(segments)}")

    def _json_body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise _HTTPError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise _HTTPError(400, "the body must be a JSON object")
        return body


def _content_headers(document: Document) -> dict[str, str]:
    textual = document.media_type.startswith("text/")
    return {
        "Content-Type": document.media_type + ("; charset=utf-8" if textual else ""),
        "Content-Disposition": f'attachment; filename="{document.name}"',
    }


class _DownloadHandler(_Handler):
    """The download server: ``GET /_downloads/TENANT/ID/SIGNATURE`` serves a file's current
    content to anyone holding the signed path, and refuses a request that also carries an
    ``Authorization`` header, as presigned-URL stores do (one credential per request)."""

    def _dispatch(self, method: str) -> None:
        try:
            status, body, headers = self._download(method, urlsplit(self.path).path)
        except _HTTPError as exc:
            status, body, headers = exc.status, {"error": exc.message}, exc.headers
        self._send(status, body, headers)

    def _download(self, method: str, path: str) -> tuple[int, Any, dict[str, str]]:
        segments = [s for s in path.split("/") if s]
        if method != "GET" or len(segments) != 4 or segments[0] != "_downloads":
            raise _HTTPError(404, f"no such download: {method} {path}")
        tenant = self.simulation.get(segments[1])
        file_id = int(segments[2]) if segments[2].isdigit() else 0
        if tenant is None or not hmac.compare_digest(path, tenant.download_path(file_id)):
            raise _HTTPError(403, "the download URL is not valid")
        if self.headers.get("Authorization") is not None:
            tenant.count("unauthorized")
            raise _HTTPError(
                400,
                "only one auth mechanism is allowed: this URL is pre-authenticated, so send no "
                "Authorization header",
            )
        document = tenant.content(file_id)
        if document is None:
            raise _HTTPError(404, f"file {file_id} was deleted")
        tenant.count("downloads")
        return 200, document.content, _content_headers(document)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up mid-response (a worker killed or cut off) is not the
        # server's error; anything else is printed as usual.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def start_server(
    simulation: Simulation | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    downloads_port: int = 0,
) -> tuple[str, Callable[[], None]]:
    """Serve ``simulation`` (by default :func:`default_simulation`) on ``host``, on a free port
    unless one is given, from a background thread, and its download server on another free
    port (``downloads_port``, unless given). Returns the base URL and a function that stops
    both servers."""
    simulation = simulation or default_simulation()
    download_handler = type("DownloadHandler", (_DownloadHandler,), {"simulation": simulation})
    downloads = _Server((host, downloads_port), download_handler)
    handler = type(
        "Handler",
        (_Handler,),
        {"simulation": simulation, "downloads_port": int(downloads.server_address[1])},
    )
    try:
        server = _Server((host, port), handler)
    except BaseException:
        downloads.server_close()
        raise
    threads = []
    for name, serving in (("simulated-provider", server), ("simulated-downloads", downloads)):
        thread = threading.Thread(
            target=serving.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True, name=name
        )
        thread.start()
        threads.append(thread)
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        for serving, thread in zip((server, downloads), threads, strict=True):
            serving.shutdown()
            serving.server_close()
            thread.join(timeout=5)

    return f"http://{bound_host}:{bound_port}", stop


def main(
    argv: Iterable[str] | None = None, *, prog: str = "python -m connectors.simulated.server"
) -> None:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the simulated provider until interrupted (docs/simulated-provider.md).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument(
        "--downloads-port", type=int, default=8766, help="the download server's (0: a free one)"
    )
    parser.add_argument(
        "--tenant",
        action="append",
        metavar="NAME",
        help="a tenant to create (repeatable; default: acme and globex)",
    )
    parser.add_argument("--size", type=int, default=100, help="rows per tenant's main tables")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--page-delay", type=float, default=0.0, help="seconds per page")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.tenant:
        simulation = Simulation()
        for name in args.tenant:
            simulation.add_tenant(name, size=args.size, seed=args.seed, page_delay=args.page_delay)
    else:
        simulation = default_simulation()
    url, stop = start_server(
        simulation, host=args.host, port=args.port, downloads_port=args.downloads_port
    )
    print(f"simulated provider at {url} (downloads on port {args.downloads_port or 'any'})")
    for tenant in simulation.tenants():
        print(f"  tenant {tenant.name}: bearer token {tenant.token!r}")
    print("control API: GET /_control/tenants; stop with Ctrl-C")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop()


if __name__ == "__main__":
    main()
