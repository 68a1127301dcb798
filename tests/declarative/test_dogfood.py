"""The simulated provider's APIs and GitHub's pull requests, declared in examples/declarative/,
sync the same rows as their Python connectors: synced side by side, through changes upstream
(rows added, changed and deleted), each declared connection holds exactly what the Python
connector's holds, tombstones included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.simulated.server import Simulation, start_server
from sync import Engine
from sync.testing import run_sync
from tests.connectors.github_fake import OWNER, GitHub, make_pull

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "declarative"


@pytest.fixture
def simulation() -> Simulation:
    return Simulation()


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def stored(engine: Engine, connection_id: int, table: str) -> dict[str, Any]:
    return {
        r.external_id: (r.data, r.deleted_at is not None)
        for r in engine.records(connection_id, table, include_deleted=True, limit=100_000)
    }


def add(engine: Engine, name: str) -> None:
    engine.add_provider((EXAMPLES / name).read_text())


@pytest.mark.parametrize(
    ("python", "declared", "file", "tables"),
    [
        ("simulated", "declared_simulated", "simulated.yaml", ("projects", "issues")),
        ("simulated_crm", "declared_simulated_crm", "simulated_crm.yaml", ("contacts", "deals")),
    ],
)
def test_the_declared_simulated_provider_syncs_the_rows_its_connector_syncs(
    engine: Engine,
    server: str,
    simulation: Simulation,
    python: str,
    declared: str,
    file: str,
    tables: tuple[str, ...],
) -> None:
    tenant = simulation.add_tenant("twin", size=120, seed=11)
    add(engine, file)
    ws = engine.create_workspace("twins")
    config = {"base_url": server, "tenant": "twin", "page_size": 10}
    ids = {
        provider: engine.create_connection(
            ws.id, provider, provider, config=config, credentials={"token": "sim-twin"}
        ).id
        for provider in (python, declared)
    }
    for generation in range(3):
        for provider, conn_id in ids.items():
            run = run_sync(engine, conn_id)
            assert run.status == "succeeded", (provider, run.error)
        for table in tables:
            ours, theirs = (stored(engine, ids[p], table) for p in (declared, python))
            assert ours == theirs, (generation, table)
            assert ours, table
        if generation:  # rows deleted upstream are tombstoned alike
            assert any(gone for _, gone in ours.values())
        tenant.advance()


def test_the_declared_github_pull_requests_are_the_connectors_rows(
    engine: Engine, respx_mock: Any
) -> None:
    github = GitHub(respx_mock)
    github.repo("Hello-World").pulls = [make_pull("Hello-World", n) for n in range(1, 151)]
    github.repo("Spoon-Knife").pulls = [make_pull("Spoon-Knife", n) for n in range(1, 4)]
    add(engine, "github_pull_requests.yaml")
    ws = engine.create_workspace("gh")
    config = {"owner": OWNER, "repos": ["Hello-World", "Spoon-Knife"]}
    ids = {
        provider: engine.create_connection(
            ws.id, provider, provider, config=config, credentials={"token": "ghp_test"}
        ).id
        for provider in ("github", "declared_github")
    }

    def both_sync() -> None:
        for provider, conn_id in ids.items():
            run = run_sync(engine, conn_id)
            assert run.status == "succeeded", (provider, run.error)
            assert run.results["pull_requests"]["partitions"].keys() == {
                "Hello-World",
                "Spoon-Knife",
            }

    both_sync()
    # A push changes the embedded repository only (ignored); a pull request is deleted.
    repo = github.repo("Hello-World")
    for pull in repo.pulls:
        pull["head"]["repo"]["pushed_at"] = "2024-06-01T00:00:00Z"
    del repo.pulls[7]
    both_sync()
    ours = stored(engine, ids["declared_github"], "pull_requests")
    assert ours == stored(engine, ids["github"], "pull_requests")
    assert sum(gone for _, gone in ours.values()) == 1
    assert len(ours) == 153
