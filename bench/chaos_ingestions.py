"""The ingestions of the chaos run (bench/chaos.py), and their lines in its reckoning.

Every sixth tenant's connections sync the simulated document store (``simulated_docs``), so each
file they list, and each new version of it, is ingested by the workers' ingestion lanes while
the faults land: workers killed, frozen and cut off mid-ingestion, Postgres restarted, the
provider's 429 windows on listings and downloads alike. The chunks are small and written three
to a batch, and every batch is embedded by an OpenAI-compatible endpoint served here with a
delay, so an ingestion takes many fenced batches and a fault often lands between two.

What must come out zero:

- ingestions lost: not ended once everything is idle, or ended failed or cancelled with no error
  recorded; and live files of surviving connections that are neither ready as the provider has
  them now (content and scope) nor ended with a recorded failure;
- batches embedded more than once past the one allowed: an attempt that ended early (killed,
  frozen or cut off past its lease, or failed) may leave one batch embedded and not written, so
  each later attempt of an ingestion on the same bytes may embed one batch again; a batch
  embedded again beyond that is counted. A Postgres crash may lose the last batches' commits
  (they commit without waiting for the WAL flush), so a batch embedded before a crash and again
  after it is not counted;
- chunks past a tail: chunk rows of a ready document at or past its final chunk count (and,
  beside it, ready documents missing a chunk below it);
- requests inside a provider's window: the simulated provider notes when each request arrived
  and each window its 429s announced; a request counts if it arrived inside a window more than
  ``GRACE`` seconds after a worker had recorded that window in the shared rate budget (an audit
  trigger notes each record), since no worker may send into a window it can know of. A request
  arriving within ``GRACE`` of a frozen worker's resume is left out (and counted apart): the
  worker read the budget before it was stopped, and the request was on its way.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connectors.simulated import SimulatedConfig, SimulatedCrm, SimulatedDocs, SimulatedTracker
from connectors.simulated.tenants import Simulation
from sync import Engine
from sync.jobs.budgets import budget_key_of

DOCS_EVERY = 6  # connections of every sixth tenant sync its document store
BATCH = 3  # chunks per fenced batch
CHUNK_CHARS = 200
CHUNK_OVERLAP = 40
DIMENSIONS = 16
EMBED_DELAY = 0.03  # seconds the endpoint takes per request
ARCHIVE_RECLAIM = 10.0  # an archive expansion whose worker died is taken again after this
GRACE = 0.5  # seconds a window takes to reach every worker once one has recorded it
MODEL = "chaos-embeddings"

# Where each API of the simulated provider is spent from: one shared budget per provider.
CONNECTORS = {"tracker": SimulatedTracker, "crm": SimulatedCrm, "docs": SimulatedDocs}

AUDIT = """
CREATE TABLE chaos_budget_audit (
    key text, blocked_until timestamptz, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_budget_audit_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_budget_audit (key, blocked_until) VALUES (NEW.key, NEW.blocked_until);
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_budget_audit AFTER INSERT OR UPDATE ON rate_budgets
    FOR EACH ROW EXECUTE FUNCTION chaos_budget_audit_write();
"""

CHECKS = {
    "ingestions lost (not ended, or failed with no error recorded)": """
        SELECT count(*) FROM ingestions
         WHERE status IN ('queued', 'running')
            OR (status IN ('failed', 'cancelled') AND error IS NULL)""",
    "chunks past a ready document's final chunk count": """
        SELECT count(*) FROM document_chunks c JOIN documents d ON d.id = c.document_id
         WHERE d.status = 'ready' AND c.chunk_index >= d.chunks""",
    "ready documents missing a chunk": """
        SELECT count(*) FROM documents d
         WHERE d.status = 'ready'
           AND d.chunks <> (SELECT count(*) FROM document_chunks c
                             WHERE c.document_id = d.id AND c.chunk_index < d.chunks)""",
}

FIGURES = {
    "ingestions created (archives and their members included)": "SELECT count(*) FROM ingestions",
    "ingestions ready": "SELECT count(*) FROM ingestions WHERE status = 'ready'",
    "ingestions failed (error recorded)": "SELECT count(*) FROM ingestions WHERE status = 'failed'",
    "ingestions cancelled (file or connection deleted)": """
        SELECT count(*) FROM ingestions WHERE status = 'cancelled'""",
    "archives expanded": """
        SELECT count(*) FROM ingestions WHERE kind = 'archive' AND status = 'ready'""",
    "chunks stored": "SELECT count(*) FROM document_chunks",
    "windows recorded in the shared rate budgets": "SELECT count(*) FROM chaos_budget_audit",
}


def is_docs(connection_index: int, tenants: int) -> bool:
    return (connection_index % tenants) % DOCS_EVERY == 0


def settings() -> dict[str, Any]:
    """The workers' settings for ingestions (beside the run's own)."""
    return {
        "ingestion_batch_size": BATCH,
        "archive_reclaim_seconds": ARCHIVE_RECLAIM,
        "embedder": "openai",
        "embeddings_model": MODEL,
        "embeddings_dimensions": DIMENSIONS,
    }


def environment() -> dict[str, str]:
    """The chunk settings, read by every worker from its environment."""
    return {
        "CONNECTOR_SYNC_DOCUMENTS_CHUNK_CHARS": str(CHUNK_CHARS),
        "CONNECTOR_SYNC_DOCUMENTS_CHUNK_OVERLAP": str(CHUNK_OVERLAP),
    }


# -- the embeddings endpoint ---------------------------------------------------------------------


def vector(text: str) -> list[float]:
    digest = hashlib.blake2b(text.encode(), digest_size=DIMENSIONS).digest()
    return [b / 255 - 0.5 for b in digest]


class EmbeddingEndpoint:
    """An OpenAI-compatible ``POST /embeddings`` on 127.0.0.1 that takes ``delay`` seconds per
    request and counts them."""

    def __init__(self, delay: float = EMBED_DELAY) -> None:
        self.requests = 0
        lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with lock:
                    endpoint.requests += 1
                time.sleep(delay)
                data = [
                    {"object": "embedding", "index": i, "embedding": vector(text)}
                    for i, text in enumerate(body["input"])
                ]
                payload = json.dumps({"object": "list", "data": data, "model": MODEL}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# -- batches embedded again ----------------------------------------------------------------------

_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?"
    r"(?:\d+ chunk\(s\) of bytes sha256:(?P<sha>\w+), embedding from chunk \d+"
    r"|embedded chunks (?P<first>\d+)-\d+ of \d+)"
    r" \[ingestion=(?P<ingestion>\d+) attempt=\d+ worker=(?P<worker>\S+)\]"
)


@dataclass
class Embeds:
    """What the workers' logs say they embedded: when each batch was embedded, keyed by
    ingestion, bytes and first chunk, and how many attempts embedded something per ingestion
    and bytes."""

    batches: dict[tuple[int, str, int], list[float]] = field(default_factory=dict)
    attempts: Counter[tuple[int, str]] = field(default_factory=Counter)

    @property
    def embedded(self) -> int:
        return sum(len(times) for times in self.batches.values())


def read_embeds(lines: Iterable[str]) -> Embeds:
    """The embeds the workers' logs name, each log in order (each attempt states its bytes
    before its first batch; a worker runs one attempt of an ingestion at a time)."""
    embeds = Embeds()
    bytes_of: dict[tuple[str, int], str] = {}  # (worker, ingestion): its attempt's bytes
    embedding: set[tuple[str, int]] = set()  # attempts that have embedded a batch
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        at = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        ingestion = int(found["ingestion"])
        key = (found["worker"], ingestion)
        if found["sha"] is not None:  # an attempt begins
            bytes_of[key] = found["sha"]
            embedding.discard(key)
            continue
        sha = bytes_of.get(key)
        if sha is None:
            continue  # its attempt began in a log that is gone; nothing to compare it with
        if key not in embedding:
            embedding.add(key)
            embeds.attempts[(ingestion, sha)] += 1
        embeds.batches.setdefault((ingestion, sha, int(found["first"])), []).append(at)
    return embeds


def embedded_again(embeds: Embeds, crashes: Sequence[float]) -> tuple[int, int]:
    """(batches embedded again within what is allowed, batches embedded again past it). Each
    attempt after the first on the same bytes may embed one batch again (the one its predecessor
    embedded and did not write); a batch embedded before a Postgres crash and again after it
    is not counted (the crash may have lost its commit)."""
    again: Counter[tuple[int, str]] = Counter()
    for (ingestion, sha, _first), times in embeds.batches.items():
        ordered = sorted(times)
        for before, after in itertools.pairwise(ordered):
            if not any(before < crash < after for crash in crashes):
                again[(ingestion, sha)] += 1
    allowed = past = 0
    for key, count in again.items():
        may = max(embeds.attempts[key] - 1, 0)
        allowed += min(count, may)
        past += max(count - may, 0)
    return allowed, past


# -- requests inside a window --------------------------------------------------------------------


def inside_recorded_windows(
    requests: Sequence[float],
    windows: Iterable[tuple[float, float]],
    recorded: Sequence[tuple[float, float]],
    resumes: Sequence[float] = (),
    grace: float = GRACE,
) -> tuple[int, dict[float, str], int]:
    """(windows some worker recorded, requests that arrived inside one of those windows more
    than ``grace`` seconds after it was recorded, each arrival with its window, and those left
    out because they arrived within ``grace`` of a frozen worker's resume). ``requests``:
    arrival times; ``windows``: (announced, ends) as the provider said; ``recorded``: (at,
    blocked until) of each record of the budget; ``resumes``: when a frozen worker went on (a
    request it had on its way when it was stopped, its budget read already, arrives then)."""
    arrivals = sorted(requests)
    heard = 0
    inside: dict[float, str] = {}
    excused: set[float] = set()
    for start, end in windows:
        times = [at for at, until in recorded if start <= at < end and until >= end - 0.01]
        if not times:
            continue
        heard += 1
        first = bisect.bisect_left(arrivals, min(times) + grace)
        last = bisect.bisect_left(arrivals, end)
        for arrival in arrivals[first:last]:
            if any(0 <= arrival - resumed < grace for resumed in resumes):
                excused.add(arrival)
                continue
            inside[arrival] = (
                f"+{arrival - start:.3f} s into a window of {end - start:g} s announced at "
                f"{datetime.fromtimestamp(start):%H:%M:%S.%f}, recorded "
                f"{min(times) - start:.3f} s after it began"
            )
    return heard, inside, len(excused)


@dataclass
class WindowCount:
    announced: int = 0
    recorded: int = 0
    inside: int = 0
    excused: int = 0  # inside, but sent by a frozen worker as it was resumed
    samples: list[str] = field(default_factory=list)  # the first requests inside, said


def windows_of(
    simulation: Simulation,
    base_url: str,
    audit: Sequence[Mapping[str, Any]],
    resumes: Sequence[float] = (),
) -> WindowCount:
    """The windows every tenant's APIs announced, those a worker recorded, and the requests
    that came inside a recorded one (``audit``: the rows of ``chaos_budget_audit``;
    ``resumes``: when a frozen worker was let go on)."""
    by_key: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in audit:
        by_key[row["key"]].append((row["at"].timestamp(), row["blocked_until"].timestamp()))
    count = WindowCount()
    for tenant in simulation.tenants():
        timeline = tenant.timeline
        config = SimulatedConfig(base_url=base_url, tenant=tenant.name)
        for api, connector in CONNECTORS.items():
            windows = [(w.start, w.end) for w in timeline.windows if w.api == api]
            if not windows:
                continue
            key = budget_key_of(connector, connector.provider, config, {})
            requests = [at for a, at in timeline.requests if a == api]
            heard, inside, excused = inside_recorded_windows(
                requests, windows, by_key.get(key or "", []), resumes
            )
            count.announced += len(windows)
            count.recorded += heard
            count.inside += len(inside)
            count.excused += excused
            count.samples += [f"{tenant.name} {api}: {said}" for said in inside.values()][:10]
    return count


# -- files lost ----------------------------------------------------------------------------------


def files_lost(engine: Engine, simulation: Simulation) -> list[str]:
    """Live files of surviving document-store connections that are neither ready as the
    provider has them now (bytes and scope; for an archive, expanded) nor ended with a
    recorded failure."""
    lost = []
    with engine.pool.connection() as conn:
        for connection in engine.connections():
            if connection.status != "active" or connection.provider != "simulated_docs":
                continue
            documents = {
                r["external_id"]: r
                for r in conn.execute(
                    "SELECT external_id, status, content_sha256, scope FROM documents "
                    "WHERE connection_id = %s AND member_path = ''",
                    (connection.id,),
                ).fetchall()
            }
            latest = {
                r["external_id"]: r
                for r in conn.execute(
                    "SELECT DISTINCT ON (external_id) external_id, kind, status, error "
                    "FROM ingestions WHERE connection_id = %s AND member_path = '' "
                    "ORDER BY external_id, id DESC",
                    (connection.id,),
                ).fetchall()
            }
            tenant = simulation.tenant(connection.config["tenant"])
            for row in tenant.rows("files"):
                key = str(row["id"])
                if not _indexed(row, documents.get(key), latest.get(key)):
                    lost.append(f"{connection.name}/{row['name']}")
    return lost


def _indexed(
    row: Mapping[str, Any], document: Mapping[str, Any] | None, last: Mapping[str, Any] | None
) -> bool:
    if last is not None and last["status"] in ("failed", "cancelled") and last["error"]:
        return True  # a recorded failure
    if row["kind"] == "zip":
        return last is not None and last["kind"] == "archive" and last["status"] == "ready"
    return (
        document is not None
        and document["status"] == "ready"
        and document["content_sha256"] == row["sha256"]
        and document["scope"] == f"project:{row['project_id']}"
    )
