"""The simulated provider: a small HTTP server on 127.0.0.1 that behaves like a SaaS API worth
syncing. It pages, answers some requests with 429 + Retry-After or 503, refuses a wrong token
with 401, and its data changes between syncs: each call to :meth:`Tenant.advance` (or
``POST /_control/tenants/NAME/advance``) moves a tenant to its next *generation*, adding, updating
and deleting a seeded, reproducible set of rows.

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
import hashlib
import hmac
import json
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from connectors.simulated.documents import Document, generate, kind_of

TRACKER_TABLES = ("projects", "issues")
CRM_TABLES = ("contacts", "deals")
DOCS_TABLES = ("files",)
MAX_PAGE_SIZE = 500
FAULTS = ("ok", "429", "503", "401")

_STAGES = ("lead", "qualified", "proposal", "won", "lost")
_STATES = ("open", "in_progress", "review", "closed")
_PEOPLE = ("ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "radia")


@dataclass
class Faults:
    """What the next data requests of a tenant get instead of data.

    ``script`` is consumed one entry per data request (``"429"``, ``"503"``, ``"401"`` or
    ``"ok"``); once it is empty, every ``rate_limit_every``-th request gets a 429 and every
    ``unavailable_every``-th a 503 (counting all data requests of the tenant).

    ``budget`` is a rate window, as real APIs count them: once that many data requests were
    served in the current window, every request gets a 429 whose Retry-After is ``window``
    seconds, until the window ends. The window ends when :meth:`Tenant.reset_window` says so,
    which is the tests' clock: no test waits for it."""

    script: deque[str] = field(default_factory=deque)
    rate_limit_every: int | None = None
    unavailable_every: int | None = None
    retry_after: float = 2.0
    budget: int | None = None
    window: float = 3600.0
    used: int = 0  # data requests served in the current window

    def describe(self) -> dict[str, Any]:
        return {
            "script": list(self.script),
            "rate_limit_every": self.rate_limit_every,
            "unavailable_every": self.unavailable_every,
            "retry_after": self.retry_after,
            "budget": self.budget,
            "window": self.window,
            "used": self.used,
        }


@dataclass
class Stats:
    requests: int = 0
    pages: int = 0
    rate_limited: int = 0
    unavailable: int = 0
    unauthorized: int = 0
    not_found: int = 0
    downloads: int = 0  # content served, directly or from a download URL

    def describe(self) -> dict[str, int]:
        return dict(self.__dict__)


class _Table:
    """One table of a tenant: rows by id, the generation each row last changed in, and the
    generation each deleted id disappeared in (for the incremental feed)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.changed_in: dict[int, int] = {}
        self.deleted_in: dict[int, int] = {}
        self.next_id = 1

    def live(self) -> list[dict[str, Any]]:
        return [self.rows[i] for i in sorted(self.rows)]


class Tenant:
    """One customer account of the simulated provider. Thread-safe: the server's request
    threads and the caller share it under the simulation's lock."""

    def __init__(
        self,
        name: str,
        *,
        token: str,
        size: int,
        seed: int,
        page_delay: float,
        lock: threading.RLock,
    ) -> None:
        self.name = name
        self.token = token
        self.size = size
        self.seed = seed
        self.page_delay = page_delay
        self.content_redirect = True  # /content answers 302 to a download URL
        self.generation = 0
        self.faults = Faults()
        self.stats = Stats()
        self.log: list[str] = []  # every data request's path and query, in order
        self._hooks: dict[str, Callable[[int, int], None]] = {}
        self._lock = lock
        self._tables: dict[str, _Table] = {
            t: _Table() for t in (*TRACKER_TABLES, *CRM_TABLES, *DOCS_TABLES)
        }
        counts = {
            "projects": max(2, size // 10),
            "issues": size,
            "contacts": size,
            "deals": max(2, size // 2),
            "files": max(5, size // 10),  # at least one of each kind, a ZIP among them
        }
        for table, count in counts.items():
            rng = self._rng(table)
            for _ in range(count):
                self._insert(table, rng)

    # -- changing the data -----------------------------------------------------------------

    def advance(self) -> dict[str, dict[str, list[int]]]:
        """Move to the next generation: in every table about a tenth of the rows (at least one
        each) is deleted, as many are updated and as many added; in ``files``, as many again
        move to another project (``moved``), their content unchanged. Returns the ids touched,
        by table and change. The same seed always makes the same changes."""
        with self._lock:
            self.generation += 1
            summary: dict[str, dict[str, list[int]]] = {}
            for table, data in self._tables.items():
                rng = self._rng(table)
                ids = sorted(data.rows)
                n = max(1, len(ids) // 10)
                doomed = sorted(rng.sample(ids, min(n, max(len(ids) - 1, 0))))
                for i in doomed:
                    del data.rows[i]
                    data.changed_in.pop(i, None)
                    data.deleted_in[i] = self.generation
                remaining = sorted(data.rows)
                touched = sorted(rng.sample(remaining, min(n, len(remaining))))
                for i in touched:
                    self._update(table, data.rows[i], rng)
                    data.changed_in[i] = self.generation
                moved = self._move_files(data, set(touched), n, rng) if table == "files" else None
                added = [self._insert(table, rng) for _ in range(n)]
                summary[table] = {"added": added, "updated": touched, "deleted": doomed}
                if moved is not None:
                    summary[table]["moved"] = moved
            return summary

    def _move_files(self, data: _Table, touched: set[int], n: int, rng: random.Random) -> list[int]:
        """Move up to ``n`` files not otherwise changed to another live project."""
        projects = sorted(self._tables["projects"].rows)
        candidates = [i for i in sorted(data.rows) if i not in touched]
        moved = []
        for i in sorted(rng.sample(candidates, min(n, len(candidates)))):
            row = data.rows[i]
            others = [p for p in projects if p != row["project_id"]]
            if others:
                row["project_id"] = rng.choice(others)
                data.changed_in[i] = self.generation
                moved.append(i)
        return moved

    def content(self, file_id: int) -> Document | None:
        """A live file's current content, or None once it is deleted."""
        with self._lock:
            row = self._tables["files"].rows.get(file_id)
            if row is None:
                return None
            return generate(file_id, row["version"], self._content_seed)

    def download_path(self, file_id: int) -> str:
        """The pre-authenticated path of a file's content on the download server: the
        signature, made with the tenant's token, is the credential."""
        signed = f"{self.name}:{file_id}".encode()
        signature = hmac.new(self.token.encode(), signed, hashlib.sha256).hexdigest()[:32]
        return f"/_downloads/{self.name}/{file_id}/{signature}"

    @property
    def _content_seed(self) -> str:
        return f"{self.seed}:{self.name}"

    def reset_window(self) -> None:
        """The rate window ends: the budget is whole again."""
        with self._lock:
            self.faults.used = 0

    def on_change(self, table: str, hook: Callable[[int, int], None] | None) -> None:
        """Call ``hook(page, per_page)`` while a page of ``table`` is being served, under the
        simulation's lock, before the page is cut: tests act at an exact moment of a read (a
        worker killed while it asks for page 12)."""
        with self._lock:
            if hook is None:
                self._hooks.pop(table, None)
            else:
                self._hooks[table] = hook

    def script_faults(self, *faults: str) -> None:
        """Answer the next data requests with these, in order (``"429"``, ``"503"``, ...)."""
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; use one of {', '.join(FAULTS)}")
        with self._lock:
            self.faults.script.extend(faults)

    def configure(
        self,
        *,
        rate_limit_every: int | None = None,
        unavailable_every: int | None = None,
        retry_after: float | None = None,
        page_delay: float | None = None,
        budget: int | None = None,
        window: float | None = None,
        content_redirect: bool | None = None,
    ) -> None:
        """Set the periodic faults and the rate window's budget (None: none), and optionally
        the Retry-After, the window's length, the delay and whether ``/content`` redirects."""
        with self._lock:
            if content_redirect is not None:
                self.content_redirect = content_redirect
            self.faults.rate_limit_every = rate_limit_every
            self.faults.unavailable_every = unavailable_every
            self.faults.budget = budget
            if retry_after is not None:
                self.faults.retry_after = retry_after
            if window is not None:
                self.faults.window = window
            if page_delay is not None:
                self.page_delay = page_delay

    def rows(self, table: str) -> list[dict[str, Any]]:
        """The live rows of a table, as the API serves them."""
        with self._lock:
            return [dict(r) for r in self._tables[table].live()]

    def row(self, table: str, row_id: int) -> dict[str, Any] | None:
        """One live row, or None once it is deleted."""
        with self._lock:
            found = self._tables[table].rows.get(row_id)
            return dict(found) if found is not None else None

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "generation": self.generation,
                "size": self.size,
                "seed": self.seed,
                "page_delay": self.page_delay,
                "content_redirect": self.content_redirect,
                "rows": {t: len(d.rows) for t, d in self._tables.items()},
                "faults": self.faults.describe(),
                "stats": self.stats.describe(),
            }

    # -- serving ---------------------------------------------------------------------------

    def fault_for_next_request(self) -> str:
        """Counts a data request and says what it gets (``"ok"`` or a fault)."""
        with self._lock:
            self.stats.requests += 1
            n = self.stats.requests
            if self.faults.budget is not None and self.faults.used >= self.faults.budget:
                self.stats.rate_limited += 1
                return "budget"
            if self.faults.script:
                fault = self.faults.script.popleft()
            elif self.faults.rate_limit_every and n % self.faults.rate_limit_every == 0:
                fault = "429"
            elif self.faults.unavailable_every and n % self.faults.unavailable_every == 0:
                fault = "503"
            else:
                fault = "ok"
            if fault == "429":
                self.stats.rate_limited += 1
            elif fault == "503":
                self.stats.unavailable += 1
            elif fault == "401":
                self.stats.unauthorized += 1
            else:
                self.faults.used += 1
            return fault

    def page(self, table: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], bool, int]:
        """Rows [offset, offset + limit) of a table, whether more follow, and how many rows it
        has."""
        with self._lock:
            self.stats.pages += 1
            hook = self._hooks.get(table)
            if hook is not None:
                hook(offset // limit + 1, limit)
            rows = self._tables[table].live()
            found = [dict(r) for r in rows[offset : offset + limit]]
            return found, offset + limit < len(rows), len(rows)

    def changes(
        self, table: str, since: int | None, after: int, limit: int, started_at: int | None
    ) -> tuple[list[dict[str, Any]], bool, int]:
        """The incremental feed: rows changed after generation ``since`` and ``{"id": ...,
        "deleted": true}`` for rows deleted after it (every live row when ``since`` is None),
        by id, from the first id above ``after``. Returns a page of it, whether more follow,
        and the generation the feed started at (``started_at``; on the first page, where it
        is None, the current one): a change made while the feed is paged may show now, and
        shows again in the feed since then."""
        with self._lock:
            self.stats.pages += 1
            data = self._tables[table]
            if since is None:
                feed = data.live()
            else:
                entries: list[tuple[int, dict[str, Any]]] = [
                    (i, data.rows[i]) for i, gen in data.changed_in.items() if gen > since
                ]
                entries += [
                    (i, {"id": i, "deleted": True})
                    for i, gen in data.deleted_in.items()
                    if gen > since
                ]
                feed = [row for _, row in sorted(entries, key=lambda e: e[0])]
            rest = [row for row in feed if row["id"] > after]
            chunk = [dict(r) for r in rest[:limit]]
            return chunk, len(rest) > limit, self.generation if started_at is None else started_at

    # -- rows ------------------------------------------------------------------------------

    def _rng(self, table: str) -> random.Random:
        return random.Random(f"{self.seed}:{self.name}:{table}:{self.generation}")

    def _insert(self, table: str, rng: random.Random) -> int:
        data = self._tables[table]
        row_id = data.next_id
        data.next_id += 1
        row: dict[str, Any] = {"id": row_id}
        if table == "projects":
            row |= {"key": f"P{row_id}", "name": f"Project {row_id}", "lead": rng.choice(_PEOPLE)}
        elif table == "issues":
            projects = sorted(self._tables["projects"].rows) or [1]
            row |= {
                "project_id": rng.choice(projects),
                "title": f"Issue {row_id}",
                "state": rng.choice(_STATES),
                "assignee": rng.choice(_PEOPLE),
            }
        elif table == "contacts":
            person = rng.choice(_PEOPLE)
            row |= {
                "name": f"{person.title()} {row_id}",
                "email": f"{person}{row_id}@{self.name}.example",
            }
        elif table == "files":
            projects = sorted(self._tables["projects"].rows) or [1]
            row["project_id"] = rng.choice(projects)
            self._describe_content(row, 1)
            data.rows[row_id] = row
            data.changed_in[row_id] = self.generation
            return row_id
        else:
            contacts = sorted(self._tables["contacts"].rows) or [1]
            row |= {
                "contact_id": rng.choice(contacts),
                "stage": rng.choice(_STAGES),
                "amount": rng.randrange(1_000, 100_000, 100),
            }
        row["version"] = 1
        data.rows[row_id] = row
        data.changed_in[row_id] = self.generation
        return row_id

    def _update(self, table: str, row: dict[str, Any], rng: random.Random) -> None:
        row["version"] += 1
        if table == "projects":
            row["lead"] = rng.choice(_PEOPLE)
        elif table == "issues":
            row["state"] = rng.choice(_STATES)
        elif table == "contacts":
            row["name"] = f"{rng.choice(_PEOPLE).title()} {row['id']}"
        elif table == "files":
            self._describe_content(row, row["version"])  # new content: size and hash change
        else:
            row["stage"] = rng.choice(_STAGES)
            row["amount"] = rng.randrange(1_000, 100_000, 100)

    def _describe_content(self, row: dict[str, Any], version: int) -> None:
        document = generate(row["id"], version, self._content_seed)
        row |= {
            "name": document.name,
            "kind": kind_of(row["id"]),
            "media_type": document.media_type,
            "size": len(document.content),
            "sha256": hashlib.sha256(document.content).hexdigest(),
            "version": version,
        }


class Simulation:
    """The simulated provider's state: its tenants. One simulation can be served by one
    server; tests and the demo keep a reference to change it while connectors read it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tenants: dict[str, Tenant] = {}

    def add_tenant(
        self,
        name: str,
        *,
        token: str | None = None,
        size: int = 100,
        seed: int = 1,
        page_delay: float = 0.0,
    ) -> Tenant:
        """Create (or replace) a tenant; its bearer token defaults to ``sim-NAME``."""
        if not name or "/" in name:
            raise ValueError("a tenant name is a non-empty path segment")
        tenant = Tenant(
            name,
            token=token or f"sim-{name}",
            size=size,
            seed=seed,
            page_delay=page_delay,
            lock=self._lock,
        )
        with self._lock:
            self._tenants[name] = tenant
        return tenant

    def tenant(self, name: str) -> Tenant:
        with self._lock:
            return self._tenants[name]

    def get(self, name: str) -> Tenant | None:
        with self._lock:
            return self._tenants.get(name)

    def tenants(self) -> list[Tenant]:
        with self._lock:
            return list(self._tenants.values())


def default_simulation() -> Simulation:
    """Two tenants, ``acme`` and ``globex``, for a server started with no arguments."""
    simulation = Simulation()
    simulation.add_tenant("acme", size=120, seed=1)
    simulation.add_tenant("globex", size=60, seed=2)
    return simulation


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
            with tenant._lock:
                tenant.stats.unauthorized += 1
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
            with tenant._lock:
                tenant.stats.not_found += 1
            raise _HTTPError(404, f"no such endpoint: /{api}/{tenant_name}/{route}")
        with tenant._lock:
            tenant.log.append(self.path.split("/", 3)[-1])
        fault = tenant.fault_for_next_request()
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
                with tenant._lock:
                    tenant.stats.not_found += 1
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
            with tenant._lock:
                tenant.stats.not_found += 1
            raise _HTTPError(404, f"no file {raw_id!r}: it does not exist or was deleted")
        if tenant.content_redirect:
            host = urlsplit(f"//{self.headers.get('Host') or '127.0.0.1'}").hostname or "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
            location = f"http://{host}:{self.downloads_port}{tenant.download_path(file_id)}"
            return 302, b"", {"Location": location}
        with tenant._lock:
            tenant.stats.downloads += 1
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
            with tenant._lock:
                tenant.stats.unauthorized += 1
            raise _HTTPError(
                400,
                "only one auth mechanism is allowed: this URL is pre-authenticated, so send no "
                "Authorization header",
            )
        document = tenant.content(file_id)
        if document is None:
            raise _HTTPError(404, f"file {file_id} was deleted")
        with tenant._lock:
            tenant.stats.downloads += 1
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
