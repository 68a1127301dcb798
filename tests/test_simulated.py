"""The simulated provider: its server pages, rate-limits, fails and changes between generations,
and its connectors sync it through the engine (full tables tombstone, the incremental feed
reports deletions, a 429's Retry-After requeues the run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from connectors import Position, Total
from connectors.simulated import SimulatedConfig, SimulatedCrm, SimulatedTracker
from connectors.simulated.server import Simulation, Tenant, start_server
from connectors.testing import FakeContext, read_table
from sync import Engine
from sync.testing import run_sync
from tests.conftest import make_settings

AUTH = {"Authorization": "Bearer sim-acme"}


@pytest.fixture
def simulation() -> Simulation:
    simulation = Simulation()
    simulation.add_tenant("acme", size=45, seed=7)
    return simulation


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def tenant(simulation: Simulation) -> Tenant:
    return simulation.tenant("acme")


def connect(engine: Engine, server: str, provider: str) -> int:
    """A connection to the acme tenant, pages of ten; returns its id."""
    ws = engine.create_workspace(f"sim-{provider}")
    config = {"base_url": server, "tenant": "acme", "page_size": 10}
    creds = {"token": "sim-acme"}
    return engine.create_connection(ws.id, "c", provider, config=config, credentials=creds).id


def test_tracker_pages_by_link_header(server: str, simulation: Simulation) -> None:
    seen: list[dict[str, Any]] = []
    url: str | None = f"{server}/tracker/acme/issues?per_page=10"
    pages = 0
    while url:
        response = httpx.get(url, headers=AUTH)
        assert response.status_code == 200
        seen += response.json()
        pages += 1
        url = response.links.get("next", {}).get("url")
    assert pages == 5  # 45 issues, 10 a page
    assert seen == tenant(simulation).rows("issues")


def test_crm_pages_by_cursor(server: str, simulation: Simulation) -> None:
    seen: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 20}
    pages = 0
    while True:
        body = httpx.get(f"{server}/crm/acme/contacts", params=params, headers=AUTH).json()
        seen += body["data"]
        pages += 1
        if not body["next_cursor"]:
            break
        params["cursor"] = body["next_cursor"]
    assert pages == 3
    assert [r["id"] for r in seen] == [r["id"] for r in tenant(simulation).rows("contacts")]


def test_429_with_retry_after_503_and_401(server: str, simulation: Simulation) -> None:
    acme = tenant(simulation)
    acme.configure(retry_after=7)
    acme.script_faults("429", "503")
    issues = f"{server}/tracker/acme/issues"
    limited = httpx.get(issues, headers=AUTH)
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "7"
    unavailable = httpx.get(issues, headers=AUTH)
    assert unavailable.status_code == 503
    assert "Retry-After" not in unavailable.headers
    assert httpx.get(issues, headers=AUTH).status_code == 200
    assert httpx.get(issues, headers={"Authorization": "Bearer wrong"}).status_code == 401
    stats = acme.describe()["stats"]
    assert (stats["rate_limited"], stats["unavailable"], stats["unauthorized"]) == (1, 1, 1)


def test_periodic_faults(server: str, simulation: Simulation) -> None:
    tenant(simulation).configure(rate_limit_every=3, unavailable_every=4)
    codes = [httpx.get(f"{server}/crm/acme/contacts", headers=AUTH).status_code for _ in range(8)]
    assert codes == [200, 200, 429, 503, 200, 429, 200, 503]


def test_generations_add_update_and_delete(server: str, simulation: Simulation) -> None:
    acme = tenant(simulation)
    before = {r["id"]: r for r in acme.rows("issues")}
    changes = httpx.post(f"{server}/_control/tenants/acme/advance").json()
    assert changes["generation"] == 1
    issues = changes["changes"]["issues"]
    assert issues["added"] and issues["updated"] and issues["deleted"]
    after = {r["id"]: r for r in acme.rows("issues")}
    assert set(issues["deleted"]).isdisjoint(after)
    assert set(issues["added"]).isdisjoint(before) and set(issues["added"]) <= set(after)
    for i in issues["updated"]:
        assert after[i]["version"] == before[i]["version"] + 1
    untouched = set(before) - set(issues["deleted"]) - set(issues["updated"])
    assert all(after[i] == before[i] for i in untouched)

    # The same seed makes the same changes: runs are reproducible.
    twin = Simulation().add_tenant("acme", size=45, seed=7)
    assert twin.advance()["issues"] == issues


def test_change_feed_reports_changes_and_deletions(server: str, simulation: Simulation) -> None:
    acme = tenant(simulation)
    first = httpx.get(f"{server}/crm/acme/deals/changes", params={"limit": 500}, headers=AUTH)
    assert first.json()["generation"] == 0
    assert len(first.json()["data"]) == len(acme.rows("deals"))
    deals = acme.advance()["deals"]
    feed = httpx.get(
        f"{server}/crm/acme/deals/changes", params={"since": 0, "limit": 500}, headers=AUTH
    ).json()
    deleted = sorted(r["id"] for r in feed["data"] if r.get("deleted"))
    changed = sorted(r["id"] for r in feed["data"] if not r.get("deleted"))
    assert deleted == deals["deleted"]
    assert changed == sorted(deals["added"] + deals["updated"])
    assert feed["generation"] == 1


def replay_feed(server: str, since: int | None, mirror: dict[int, Any], between: Any) -> int:
    """Page through the deals feed as the connector does, applying it to ``mirror``; calls
    ``between()`` after each page. Returns the generation to resume from."""
    params: dict[str, Any] = {"limit": 3} | ({} if since is None else {"since": since})
    while True:
        body = httpx.get(f"{server}/crm/acme/deals/changes", params=params, headers=AUTH).json()
        for row in body["data"]:
            if row.get("deleted"):
                mirror.pop(row["id"], None)
            else:
                mirror[row["id"]] = row
        if body["next_cursor"] is None:
            return int(body["generation"])
        params["cursor"] = body["next_cursor"]
        between()


def test_change_feed_misses_nothing_when_the_data_changes_while_it_is_paged(
    server: str, simulation: Simulation
) -> None:
    # A generation that lands between two pages moves deals in and out of the feed; the
    # generation to resume from must still cover every change the pages did not show.
    acme = tenant(simulation)
    mirror: dict[int, Any] = {}
    generation = replay_feed(server, None, mirror, acme.advance)
    for _ in range(3):
        generation = replay_feed(server, generation, mirror, acme.advance)
    replay_feed(server, generation, mirror, lambda: None)  # nothing changes while it pages
    assert mirror == {row["id"]: row for row in acme.rows("deals")}


def test_connectors_read_through_the_sdk(server: str, simulation: Simulation) -> None:
    config = SimulatedConfig(base_url=server, tenant="acme", page_size=10)
    context = FakeContext(config=config, credentials={"token": "sim-acme"})
    tracker = SimulatedTracker(context)
    items = read_table(tracker, "issues")
    assert [i for i in items if isinstance(i, dict)] == tenant(simulation).rows("issues")
    # Each page says the table's size and, but for the last, where the listing goes on.
    assert {i.count for i in items if isinstance(i, Total)} == {
        len(tenant(simulation).rows("issues"))
    }
    positions = [i.value["next"] for i in items if isinstance(i, Position)]
    assert len(positions) == 4 and positions[0].endswith("issues?page=2&per_page=10")
    tracker.close()
    crm = SimulatedCrm(context)
    items = read_table(crm, "deals")
    assert items[-1].cursor == {"generation": 0}  # type: ignore[union-attr]
    crm.close()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        SimulatedConfig(base_url="ftp://x", tenant="acme")
    with pytest.raises(ValueError):
        SimulatedConfig.model_validate({"base_url": "http://x", "tenant": "a", "extra": 1})


@pytest.fixture
def sim_engine(schema: str) -> Iterator[Engine]:
    # Retry-After beyond one second ends the attempt (instead of sleeping inside it).
    with Engine(make_settings(schema, max_inline_wait=1.0)) as engine:
        engine.migrate()
        yield engine


def test_sync_tombstones_upstream_deletions(
    sim_engine: Engine, server: str, simulation: Simulation
) -> None:
    engine = sim_engine
    tracker = connect(engine, server, "simulated")
    crm = connect(engine, server, "simulated_crm")
    assert run_sync(engine, tracker).status == "succeeded"
    assert run_sync(engine, crm).status == "succeeded"

    changes = tenant(simulation).advance()
    second = run_sync(engine, tracker)
    assert second.results["issues"]["tombstoned"] == len(changes["issues"]["deleted"])
    assert second.results["issues"]["upserted"] == len(
        changes["issues"]["added"] + changes["issues"]["updated"]
    )
    crm_run = run_sync(engine, crm)
    assert crm_run.results["deals"]["tombstoned"] == len(changes["deals"]["deleted"])
    assert crm_run.results["contacts"]["tombstoned"] == len(changes["contacts"]["deleted"])

    live = {r.external_id for r in engine.records(tracker, "issues")}
    assert live == {str(r["id"]) for r in tenant(simulation).rows("issues")}
    deals = {r.external_id for r in engine.records(crm, "deals")}
    assert deals == {str(r["id"]) for r in tenant(simulation).rows("deals")}


def test_a_feed_read_from_the_start_tombstones_deals_an_unfinished_sync_left(
    sim_engine: Engine, server: str, simulation: Simulation
) -> None:
    # A first sync cancelled after it wrote some deals leaves them without a cursor. If a
    # generation deletes one of them before the next sync, that sync reads the feed from the
    # start, which lists live deals only: the deleted one must go, not stay forever.
    engine = sim_engine
    crm = connect(engine, server, "simulated_crm")
    assert run_sync(engine, crm).status == "succeeded"
    with engine.pool.connection() as conn:
        conn.execute(
            "DELETE FROM table_state WHERE connection_id = %s AND table_name = 'deals'", (crm,)
        )
    deleted = tenant(simulation).advance()["deals"]["deleted"]

    run = run_sync(engine, crm)
    assert run.status == "succeeded"
    assert run.results["deals"]["tombstoned"] == len(deleted) > 0
    deals = {r.external_id for r in engine.records(crm, "deals")}
    assert deals == {str(r["id"]) for r in tenant(simulation).rows("deals")}


def test_429_requeues_the_run_after_retry_after(
    sim_engine: Engine, server: str, simulation: Simulation
) -> None:
    engine = sim_engine
    acme = tenant(simulation)
    acme.configure(retry_after=30)
    acme.script_faults("429")
    ws = engine.create_workspace("sim")
    conn = engine.create_connection(
        ws.id,
        "c",
        "simulated_crm",
        config={"base_url": server, "tenant": "acme"},
        credentials={"token": "sim-acme"},
    )
    run = run_sync(engine, conn.id, skip_retry_waits=False)
    # Waiting for the provider spends no attempt; the wait is counted and said.
    assert run.status == "queued" and run.attempts == 0 and run.waits == 1
    assert run.waiting_for == "the simulated_crm rate limit" and run.waiting_until == run.queued_at
    assert run.error is not None and run.error.kind == "rate_limited"
    assert run.results["contacts"]["error"]["retry_after"] == 30
    delay = (run.queued_at - engine.attempts(run.id)[0].finished_at).total_seconds()  # type: ignore[operator]
    assert 29 <= delay <= 31


def test_python_dash_m_connectors_simulated_starts_the_provider(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import runpy
    import sys
    import types

    from connectors.simulated import server as module

    def interrupted(seconds: float) -> None:  # Ctrl-C as soon as the server is up
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "time", types.SimpleNamespace(sleep=interrupted))
    monkeypatch.setattr(
        sys, "argv", ["connectors.simulated", "--port", "0", "--downloads-port", "0"]
    )
    runpy.run_module("connectors.simulated", run_name="__main__")
    out = capsys.readouterr().out
    assert "simulated provider at http://127.0.0.1:" in out, out
    assert "tenant acme: bearer token" in out, out


def test_a_fake_context_validates_a_dict_as_the_engine_does(
    server: str, simulation: Simulation
) -> None:
    # A plain dict is refused where it is given, not deep inside the connector's read.
    with pytest.raises(TypeError, match=r"FakeContext\.of\(MyConnector, config=\{\.\.\.\}\)"):
        FakeContext(config={"base_url": server, "tenant": "acme"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="base_url"):
        FakeContext.of(SimulatedTracker, config={"tenant": "acme"}, credentials={"token": "t"})
    with pytest.raises(ValidationError, match="token"):
        FakeContext.of(SimulatedTracker, config={"base_url": server, "tenant": "acme"})
    context = FakeContext.of(
        SimulatedTracker,
        config={"base_url": server, "tenant": "acme", "page_size": "50"},
        credentials={"token": "sim-acme"},
    )
    assert context.config == SimulatedConfig(base_url=server, tenant="acme", page_size=50)
    tracker = SimulatedTracker(context)
    rows = [i for i in read_table(tracker, "projects") if isinstance(i, dict)]
    tracker.close()
    assert rows == tenant(simulation).rows("projects")
