"""The simulated provider's data: tenants (customer accounts), each with the tables of three
APIs generated from a seed, changing only when it advances to its next *generation*, and what
its next data requests get instead of data (scripted or periodic 429s, 503s and 401s, a rate
window's budget), with counts of what it served. :class:`Simulation` holds the tenants one
server serves (``server``); tests and the demo keep it to change them while connectors read
them.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from connectors.simulated.documents import Document, generate, kind_of

TRACKER_TABLES = ("projects", "issues")
CRM_TABLES = ("contacts", "deals")
DOCS_TABLES = ("files",)
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


@dataclass(frozen=True)
class Window:
    """A rate window the provider announced with a 429: from when it was announced to when
    its Retry-After said it ends, for one API of a tenant."""

    api: str
    start: float
    end: float


@dataclass
class Timeline:
    """When each data request arrived and each window was announced, by the tenant's clock, so
    a caller can tell how many requests came inside a window somebody had heard of."""

    requests: list[tuple[str, float]] = field(default_factory=list)  # (api, arrival)
    windows: list[Window] = field(default_factory=list)


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
        clock: Callable[[], float] = time.time,
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
        self.timeline = Timeline()
        self._clock = clock
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
            now = self._clock()
            self.timeline.windows = [
                Window(w.api, w.start, min(w.end, now)) for w in self.timeline.windows
            ]

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

    def count(self, event: Literal["unauthorized", "not_found", "downloads"]) -> None:
        """Count a request answered without data (a wrong token, an unknown endpoint or row)
        or a file's content served."""
        with self._lock:
            setattr(self.stats, event, getattr(self.stats, event) + 1)

    def note_request(self, path: str) -> None:
        """Keep a data request's path and query in :attr:`log`."""
        with self._lock:
            self.log.append(path)

    def fault_for_next_request(self, api: str = "") -> str:
        """Counts a data request of ``api`` and says what it gets (``"ok"`` or a fault); notes
        when it came, and the window a 429 announces, in :attr:`timeline`."""
        with self._lock:
            now = self._clock()
            self.timeline.requests.append((api, now))
            self.stats.requests += 1
            n = self.stats.requests
            if self.faults.budget is not None and self.faults.used >= self.faults.budget:
                self.stats.rate_limited += 1
                self.timeline.windows.append(Window(api, now, now + self.faults.window))
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
                self.timeline.windows.append(Window(api, now, now + self.faults.retry_after))
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
        clock: Callable[[], float] = time.time,
    ) -> Tenant:
        """Create (or replace) a tenant; its bearer token defaults to ``sim-NAME``; ``clock``
        stamps its :attr:`Tenant.timeline`."""
        if not name or "/" in name:
            raise ValueError("a tenant name is a non-empty path segment")
        tenant = Tenant(
            name,
            token=token or f"sim-{name}",
            size=size,
            seed=seed,
            page_delay=page_delay,
            lock=self._lock,
            clock=clock,
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
