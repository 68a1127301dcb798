"""The claim against a model of its rules: hypothesis drives random enqueues, claims, finishes,
lease expiries and deletes through the real claim_run(), and after every claim the run it
returned must be exactly the one the model says is first claimable (or none)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

from sync import Engine
from sync.store.queries import QUERIES

WORKSPACES, PROVIDERS, PER_LANE = 2, ("memory", "memory_events"), 2


@dataclass
class ModelRun:
    id: int
    connection: int
    workspace: int
    provider: str
    kind: str
    status: str  # waiting | queued | running | succeeded | failed | cancelled
    attempts: int = 0
    live: bool = False  # running with an unexpired lease
    owner: Any = None


class ClaimModel(RuleBasedStateMachine):
    engine: Engine

    @initialize()
    def fresh(self) -> None:
        with self.engine.pool.connection() as conn:
            conn.execute(
                "TRUNCATE connection_runs, run_attempts, connections, workspaces, records, "
                "table_state RESTART IDENTITY CASCADE"
            )
        self.runs: dict[int, ModelRun] = {}
        self.connections: dict[
            int, tuple[int, str, str]
        ] = {}  # id -> (workspace, provider, status)
        for w in range(WORKSPACES):
            ws = self.engine.create_workspace(f"w{w}")
            for provider in PROVIDERS:
                for n in range(PER_LANE):
                    c = self.engine.create_connection(
                        ws.id, f"{provider}{n}", provider, config={"dataset": "x"}
                    )
                    self.connections[c.id] = (ws.id, provider, "active")

    def _active_on(self, connection: int) -> ModelRun | None:
        return next(
            (
                r
                for r in self.runs.values()
                if r.connection == connection and r.status in ("queued", "running")
            ),
            None,
        )

    @rule(pick=st.integers(min_value=0, max_value=10**6))
    def enqueue(self, pick: int) -> None:
        cid = sorted(self.connections)[pick % len(self.connections)]
        workspace, provider, status = self.connections[cid]
        if status != "active":
            return
        existing = self._active_on(cid)
        run = self.engine.sync(cid)
        if existing is not None:
            assert run.id == existing.id
        else:
            self.runs[run.id] = ModelRun(run.id, cid, workspace, provider, "sync", "queued")

    def _blocked(self, run: ModelRun) -> bool:
        return any(
            o.live
            and o.workspace == run.workspace
            and o.id != run.id
            and (o.kind == "purge" or run.kind == "purge" or o.provider == run.provider)
            for o in self.runs.values()
        )

    def _expected(self) -> ModelRun | None:
        """The first claimable run in id order (ids follow queued_at here), failing expired
        runs that have no attempt left on the way, as claim_run does."""
        for run in sorted(self.runs.values(), key=lambda r: r.id):
            if run.status == "queued":
                candidate = True
            elif run.status == "running":
                candidate = not run.live
            elif run.status == "waiting":
                candidate = all(
                    o.connection != run.connection or o.status not in ("queued", "running")
                    for o in self.runs.values()
                )
            else:
                candidate = False
            if not candidate or self._blocked(run):
                continue
            if run.status == "running" and run.attempts >= 3:
                run.status = "failed"
                continue
            return run
        return None

    @rule()
    def claim(self) -> None:
        expected = self._expected()
        with self.engine.pool.connection() as conn:
            row = conn.execute(
                QUERIES.claim_run,
                {
                    "worker_id": "model",
                    "lease": timedelta(minutes=5),
                    "providers": None,
                    "wakeable": False,
                },
            ).fetchone()
        if expected is None:
            assert row is None, f"claimed {row['id'] if row else None}, model expected none"
            return
        assert row is not None, f"claimed nothing, model expected run {expected.id}"
        assert row["id"] == expected.id, f"claimed {row['id']}, model expected {expected.id}"
        expected.status, expected.live = "running", True
        expected.attempts += 1
        expected.owner = row["lease_owner"]
        assert row["attempts"] == expected.attempts

    @rule(pick=st.integers(min_value=0, max_value=10**6))
    def finish(self, pick: int) -> None:
        live = sorted((r for r in self.runs.values() if r.live), key=lambda r: r.id)
        if not live:
            return
        run = live[pick % len(live)]
        with self.engine.pool.connection() as conn:
            sealed = conn.execute(
                QUERIES.finish_run,
                {
                    "run_id": run.id,
                    "lease_owner": run.owner,
                    "status": "succeeded",
                    "results": Jsonb({}),
                    "attempt_results": Jsonb({}),
                    "disconnect": False,
                    "error": None,
                    "processed_units": None,
                },
            ).fetchone()["sealed"]
        assert sealed == 1
        run.status, run.live = "succeeded", False

    @rule(pick=st.integers(min_value=0, max_value=10**6))
    def expire_lease(self, pick: int) -> None:
        live = sorted((r for r in self.runs.values() if r.live), key=lambda r: r.id)
        if not live:
            return
        run = live[pick % len(live)]
        with self.engine.pool.connection() as conn:
            conn.execute(
                "UPDATE connection_runs SET lease_expires_at = now() - interval '1s' WHERE id = %s",
                (run.id,),
            )
        run.live = False

    @rule(pick=st.integers(min_value=0, max_value=10**6))
    def delete_connection(self, pick: int) -> None:
        cid = sorted(self.connections)[pick % len(self.connections)]
        workspace, provider, status = self.connections[cid]
        if status != "active":
            return
        for run in self.runs.values():
            if run.connection == cid and run.kind == "sync" and run.status == "queued":
                run.status = "cancelled"
        busy = self._active_on(cid) is not None
        purge = self.engine.delete_connection(cid)
        assert purge.status == ("waiting" if busy else "queued")
        self.runs[purge.id] = ModelRun(purge.id, cid, workspace, provider, "purge", purge.status)
        self.connections[cid] = (workspace, provider, "deleting")


def test_the_claim_matches_the_model(engine: Engine) -> None:
    ClaimModel.engine = engine
    run_state_machine_as_test(
        ClaimModel,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
