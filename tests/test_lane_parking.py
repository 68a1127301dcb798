"""Lane parking (sql/0001_baseline.sql): a queued sync behind a busy lane (workspace and
provider) is parked, out of the claim's index, and becomes claimable exactly when its lane
frees; the limiter still holds with many concurrent claimers. Also the targeted wake-ups: an
enqueue or a finish notifies one idle worker on its own channel, or nobody when nobody can use
it."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from sync import Engine
from tests.conftest import DIRECT_URL
from tests.plans import explained, nodes

LEASE = timedelta(minutes=5)


def lane(admin: Any, count: int) -> None:
    """Workspace 1 with connections 1..count of one provider (one lane); connection count + 1
    in workspace 2."""
    admin.execute("INSERT INTO workspaces (name) VALUES ('lane'), ('other')")
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider) "
        "SELECT 1, 'c' || g, 'memory' FROM generate_series(1, %s) g",
        (count,),
    )
    admin.execute(
        "INSERT INTO connections (workspace_id, name, provider) VALUES (2, 'elsewhere', 'memory')"
    )


def claim(conn: Any, worker: str = "w", wakeable: bool = False) -> Any:
    return conn.execute(
        "SELECT id, connection_id, lease_owner FROM claim_run_v3(%s, %s, NULL, %s)",
        (worker, LEASE, wakeable),
    ).fetchone()


def finish(conn: Any, run: Any, *, wake: bool = True) -> bool:
    row = conn.execute(
        "SELECT id FROM finish_run_v4(%s, %s, 'succeeded', '{}', '{}', NULL, NULL, false, %s)",
        (run["id"], run["lease_owner"], wake),
    ).fetchone()
    return row["id"] is not None


def enqueue(conn: Any, connection_id: int) -> Any:
    return conn.execute(
        "SELECT id, parked FROM enqueue_run_v3(%s, NULL, 'manual', 3)", (connection_id,)
    ).fetchone()


def parked(conn: Any) -> list[int]:
    rows = conn.execute("SELECT connection_id FROM connection_runs WHERE parked ORDER BY id")
    return [r["connection_id"] for r in rows]


def test_a_parked_run_becomes_claimable_exactly_when_its_lane_frees(
    engine: Engine, admin: Any
) -> None:
    lane(admin, 4)
    for connection in (1, 2, 3):
        assert enqueue(admin, connection)["parked"] is False  # the lane is free at each enqueue
    first = claim(admin)
    assert first["connection_id"] == 1
    # The claim parked the rest of its lane; an enqueue into the busy lane is parked at once.
    assert parked(admin) == [2, 3]
    assert enqueue(admin, 4)["parked"] is True
    assert claim(admin) is None  # nothing claimable: the lane is busy

    assert finish(admin, first)
    assert parked(admin) == [3, 4]  # the finish unparked the oldest run of the lane, only it
    second = claim(admin)
    assert second["connection_id"] == 2
    assert claim(admin) is None

    # A requeued run (a retry with a delay) frees the lane as a finish does.
    admin.execute(
        "UPDATE connection_runs SET status = 'queued', queued_at = now() + interval '1 hour', "
        "lease_owner = NULL, lease_expires_at = NULL WHERE id = %s",
        (second["id"],),
    )
    assert parked(admin) == [4]
    # The unparked head cancelled before it ran: the next one is unparked in its place.
    admin.execute("UPDATE connection_runs SET status = 'cancelled' WHERE connection_id = 3 "
                  "AND status = 'queued'")  # fmt: skip
    assert parked(admin) == []
    assert claim(admin)["connection_id"] == 4


def test_a_parked_run_that_leaves_the_queue_is_no_longer_parked(engine: Engine, admin: Any) -> None:
    """Rule d: a parked run that leaves `queued` is no longer parked, whatever moved it. One set
    running must stay in the claim's index, so that its lease's expiry makes it claimable again;
    one cancelled must not stay parked, or a retry would send it back to the queue parked with
    no run ahead of it to unpark it."""
    lane(admin, 2)
    enqueue(admin, 1)
    enqueue(admin, 2)
    admin.execute("UPDATE connection_runs SET parked = true")
    assert claim(admin) is None  # a parked run is out of the claim's walk
    admin.execute(
        "UPDATE connection_runs SET status = 'running', attempts = 1, worker_id = 'elsewhere', "
        "lease_owner = gen_random_uuid(), lease_expires_at = now() - interval '1 second' "
        "WHERE connection_id = 1"
    )
    admin.execute("UPDATE connection_runs SET status = 'cancelled' WHERE connection_id = 2")
    assert parked(admin) == []
    assert claim(admin)["connection_id"] == 1  # the expired lease is claimed again


def test_the_claim_never_walks_parked_runs(engine: Engine, admin: Any) -> None:
    lane(admin, 3000)
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, "
        "queued_at, started_at, attempts, lease_owner, lease_expires_at, worker_id) "
        "VALUES (1, 1, 'memory', 'running', now() - interval '2 hours', now(), 1, "
        "gen_random_uuid(), now() + interval '1 day', 'elsewhere')"
    )
    # 2,999 runs behind the running one, older than the one claimable run of another workspace.
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status, queued_at) "
        "SELECT id, 1, 'memory', 'queued', now() - interval '1 hour' + id * interval '1 ms' "
        "  FROM connections WHERE workspace_id = 1 AND id > 1"
    )
    admin.execute(
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status) "
        "SELECT id, 2, 'memory', 'queued' FROM connections WHERE name = 'elsewhere'"
    )
    admin.execute("ANALYZE connection_runs")
    assert len(parked(admin)) == 2999
    row, plans = explained(
        admin, "SELECT connection_id FROM claim_run_v3('plan-test', interval '1 minute')"
    )
    assert row["connection_id"] == 3001
    candidate = next(p for p in plans if "SKIP LOCKED" in p["Query Text"])
    scans = [n for n in nodes(candidate["Plan"]) if n.get("Relation Name") == "connection_runs"]
    outer = scans[0]
    assert outer["Index Name"] == "connection_runs_claimable_unparked", json.dumps(candidate)
    # The running run and the claimable one: not the 2,999 parked behind it.
    assert outer["Actual Rows"] + outer.get("Rows Removed by Filter", 0) <= 3


class Drain:
    """Claimers on threads of their own, each with its own connection: claim, finish, repeat,
    until a claim comes back empty. Rounds of them until the queue is empty; a round in which
    nothing ran ends with one claim that nothing else can disturb: empty while runs are left,
    it means a run was stranded (parked behind a lane that is free)."""

    def __init__(self, schema: str, claimers: int) -> None:
        self.schema = schema
        self.claimers = claimers
        self.ran = 0
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []

    def claimer(self, index: int) -> None:
        try:
            with _connect(self.schema) as conn:
                while (run := claim(conn, f"t{index}")) is not None:
                    assert finish(conn, run)
                    with self.lock:
                        self.ran += 1
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def round(self) -> None:
        threads = [threading.Thread(target=self.claimer, args=(i,)) for i in range(self.claimers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.errors:
            raise self.errors[0]

    def run(self, runs: int) -> None:
        while self.ran < runs:
            before = self.ran
            self.round()
            if self.ran == before:
                with _connect(self.schema) as conn:
                    run = claim(conn, "alone")
                    assert run is not None, f"stranded: {runs - self.ran} runs left, none claimable"
                    assert finish(conn, run)
                    self.ran += 1


OVERLAPS = """
SELECT count(*) AS overlaps
  FROM run_attempts a
  JOIN connection_runs ra ON ra.id = a.run_id
  JOIN run_attempts b ON b.id > a.id
  JOIN connection_runs rb ON rb.id = b.run_id AND rb.workspace_id = ra.workspace_id
                          AND rb.provider = ra.provider
 WHERE a.started_at < b.finished_at AND b.started_at < a.finished_at
"""


@pytest.mark.parametrize("claimers", [8])
def test_concurrent_claimers_drain_parked_lanes_one_run_at_a_time(
    engine: Engine, admin: Any, schema: str, claimers: int
) -> None:
    # 3 workspaces x 2 providers = 6 lanes, 40 runs each, all queued before any claim (so the
    # first claim of each lane parks the rest), then more enqueued while the drain runs.
    admin.execute(
        "INSERT INTO workspaces (name) SELECT 'ws' || g FROM generate_series(1, 3) g;"
        "INSERT INTO connections (workspace_id, name, provider) "
        "SELECT 1 + g % 3, 'c' || g, (ARRAY['memory', 'memory_b'])[1 + g / 3 % 2] "
        "  FROM generate_series(0, 299) g;"
        "INSERT INTO connection_runs (connection_id, workspace_id, provider, status) "
        "SELECT id, workspace_id, provider, 'queued' FROM connections WHERE id <= 240"
    )

    def enqueue_late() -> None:
        with _connect(schema) as conn:
            for connection in range(241, 301):
                enqueue(conn, connection)

    late = threading.Thread(target=enqueue_late)
    drain = Drain(schema, claimers)
    late.start()
    drain.run(240)
    late.join()
    drain.run(300)  # the late enqueues may land after the first 240 ran
    counts = admin.execute(
        "SELECT count(*) AS runs, count(*) FILTER (WHERE status <> 'succeeded') AS left_over, "
        "count(*) FILTER (WHERE parked) AS parked, max(attempts) AS max_attempts "
        "FROM connection_runs"
    ).fetchone()
    assert counts == {"runs": 300, "left_over": 0, "parked": 0, "max_attempts": 1}
    assert admin.execute(OVERLAPS).fetchone()["overlaps"] == 0


def _connect(schema: str) -> Any:
    return psycopg.connect(
        DIRECT_URL,
        autocommit=True,
        options=f"-c search_path={schema}",
        row_factory=psycopg.rows.dict_row,
    )


class Channels:
    """LISTENs on the shared channel and on three workers' own channels. ``heard()`` returns
    what each got since the last call, read up to a marker sent on every channel after the
    statements under test: notifications arrive in commit order, so no wait is needed."""

    def __init__(self, admin: Any, schema: str, workers: list[str]) -> None:
        self.conn = _connect(schema)
        self.admin = admin
        names = {"shared": admin.execute("SELECT notify_channel() AS c").fetchone()["c"]}
        for worker in workers:
            names[worker] = admin.execute(
                "SELECT worker_channel_v3(%s) AS c", (worker,)
            ).fetchone()["c"]
        self.names = names
        for channel in names.values():
            self.conn.execute(f'LISTEN "{channel}"')

    def heard(self) -> dict[str, list[str]]:
        for channel in self.names.values():
            self.admin.execute("SELECT pg_notify(%s, 'marker')", (channel,))
        by_channel = {v: k for k, v in self.names.items()}
        got: dict[str, list[str]] = {k: [] for k in self.names}
        markers = 0
        for note in self.conn.notifies():
            if note.payload == "marker":
                markers += 1
                if markers == len(self.names):
                    break
                continue
            got[by_channel[note.channel]].append(note.payload)
        return {k: v for k, v in got.items() if v}


def test_an_enqueue_wakes_one_idle_worker_and_a_parked_one_wakes_nobody(
    engine: Engine, admin: Any, schema: str
) -> None:
    lane(admin, 6)
    workers = ["w1", "w2", "w3"]
    for worker in workers:
        admin.execute(
            "INSERT INTO workers (id, hostname, pid, version, providers) "
            "VALUES (%s, 'h', 1, 'v', ARRAY['memory'])",
            (worker,),
        )
        assert claim(admin, worker, wakeable=True) is None  # idle, marked so
    channels = Channels(admin, schema, workers)

    enqueue(admin, 1)
    assert channels.heard() == {"w1": ["run"]}  # the longest idle, alone
    run = claim(admin, "w1", wakeable=True)
    enqueue(admin, 2)  # its lane is busy: parked, nobody can take it
    assert channels.heard() == {}
    enqueue(admin, 7)  # another workspace
    assert channels.heard() == {"w2": ["run"]}

    # A finish whose worker claims next itself takes the unparked run and wakes nobody.
    row = admin.execute(
        "SELECT sealed, (claimed).connection_id FROM finish_and_claim_v4(%s, %s, 'succeeded', "
        "'{}', '{}', NULL, NULL, false, 'w1', %s, NULL, true)",
        (run["id"], run["lease_owner"], LEASE),
    ).fetchone()
    assert row == {"sealed": True, "connection_id": 2}
    assert channels.heard() == {}
    # A finish with no claim behind it (a stopping worker) wakes one for the lane's next run.
    enqueue(admin, 3)
    running = admin.execute(
        "SELECT id, lease_owner FROM connection_runs WHERE connection_id = 2 AND status = 'running'"
    ).fetchone()
    assert finish(admin, running)
    assert channels.heard() == {"w3": ["run"]}
    # No idle worker left visible: the shared channel, which every listener hears.
    enqueue(admin, 5)
    assert "shared" in channels.heard()
    channels.conn.close()
