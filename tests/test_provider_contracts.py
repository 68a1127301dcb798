"""The deletion and politeness contracts as a provider sees them, per reference connector: through
the command line and worker processes, against stateful fakes of GitHub, Procore and Microsoft
Graph served over HTTP (tests/provider_fakes/), with default settings.

- A row deleted upstream is tombstoned by the next sync.
- A resync with nothing changed costs at most one request per table and partition, or only 304s.
- A partition that leaves the listing that defines it has its rows tombstoned.
- Once the provider announces a window (429 with Retry-After), no request arrives inside it from
  any worker, whatever job sends it: a sync, or the download of a synced file (two jobs on one
  budget, in one process, are in tests/test_shared_budget.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cli_backends import Backend, Cli, WorkerProcess
from tests.conftest import DATABASE_URL
from tests.connectors.github_fake import GitHub, make_issue, make_pull
from tests.provider_fakes import graph, procore
from tests.provider_fakes.server import ProviderServer
from tests.waiting import poll_until, until

pytestmark = pytest.mark.slow

TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
WINDOW = 3  # seconds of Retry-After


@pytest.fixture
def command(
    schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    env: dict[str, str | None] = {"DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema}
    backend = Backend("database_url", env, schema, None)
    backend.engine().close()  # migrated, as an operator would
    return Cli(backend, capsys, monkeypatch)


@pytest.fixture
def workers(command: Cli) -> Iterator[Callable[[int], list[WorkerProcess]]]:
    started: list[WorkerProcess] = []

    def start(n: int) -> list[WorkerProcess]:
        started.extend(command.worker() for _ in range(n))
        return started

    yield start
    for worker in started:
        worker.stop()


class Connection:
    """One connection, driven through the command line."""

    def __init__(self, command: Cli, provider: str, config: Any, credentials: Any) -> None:
        self.command = command
        if not command("workspaces", "list", "--json").ok().json():
            command("workspaces", "create", "acme").ok()
        self.id = str(
            command(
                "connections", "create", "-w", "acme", "-n", f"{provider}-{_next()}",
                "-p", provider, "--config", json.dumps(config),
                "--credentials", json.dumps(credentials), "--json",
            ).ok().json()["id"]
        )  # fmt: skip

    def sync(self, *, wait: bool = True) -> dict[str, Any]:
        """Syncs now; with ``wait``, until the run ends (it must succeed)."""
        args = ["sync", self.id, "--json"] + (["--wait"] if wait else [])
        run: dict[str, Any] = self.command(*args).ok().json()
        return run

    def configure(self, config: Any) -> None:
        self.command("connections", "update", self.id, "--config", json.dumps(config)).ok()

    def rows(self, table: str) -> dict[str, bool]:
        """Each stored row of ``table``: its key, and whether it is live."""
        found = (
            self.command(
                "records", "list", self.id, table, "--deleted", "--limit", "100000", "--json"
            )
            .ok()
            .json()
        )
        return {r["external_id"]: r["deleted_at"] is None for r in found}

    def live(self, table: str) -> set[str]:
        return {key for key, live in self.rows(table).items() if live}

    def tombstoned(self, table: str) -> set[str]:
        return {key for key, live in self.rows(table).items() if not live}


_counter = iter(range(1, 1000))


def _next() -> int:
    return next(_counter)


def no_request_inside(server: ProviderServer) -> None:
    """The contract, as the provider counts it: a window was announced, nothing arrived inside
    it, and requests went on after it (so work was waiting while it held)."""
    (window,) = server.windows
    assert window.opened is not None, "the window was never announced"
    early = server.early
    assert early == [], f"{len(early)} requests inside the window, first: {early[:3]}"
    assert any(r.arrived >= window.opened + window.seconds for r in server.log)


# -- GitHub ----------------------------------------------------------------------------------


def github_config(server: ProviderServer, *repos: str) -> dict[str, Any]:
    return {"owner": "octocat", "repos": list(repos), "base_url": server.url}


def test_github_deletions_are_found_by_the_next_sync_for_304s(
    command: Cli, workers: Callable[[int], list[WorkerProcess]]
) -> None:
    github = GitHub()
    with ProviderServer(github.answer) as server:
        github.base = server.url
        for name in ("Hello-World", "Spoon-Knife"):
            repo = github.repo(name)
            repo.issues = [make_issue(name, n) for n in range(1, 251)]
            repo.pulls = [make_pull(name, n) for n in range(300, 320)]
        gh = Connection(
            command, "github", github_config(server, "Hello-World", "Spoon-Knife"),
            {"token": TOKEN},
        )  # fmt: skip
        workers(1)
        assert gh.sync()["status"] == "succeeded"

        # Three issues deleted upstream: tombstoned by the next sync.
        hello = github.repo("Hello-World")
        deleted = {str(hello.issues.pop(n)["id"]) for n in (200, 100, 5)}
        assert gh.sync()["status"] == "succeeded"
        assert gh.tombstoned("issues") == deleted

        # Nothing changed: every request of the resync is a 304 (which costs no rate limit).
        before = len(server.log)
        assert gh.sync()["status"] == "succeeded"
        resync = server.log[before:]
        assert resync and {r.status for r in resync} == {304}

        # A repository removed from the config: its rows are tombstoned, nothing asked of it.
        spoon = {str(i["id"]) for i in github.repo("Spoon-Knife").issues}
        gh.configure(github_config(server, "Hello-World"))
        before = len(server.log)
        assert gh.sync()["status"] == "succeeded"
        assert spoon <= gh.tombstoned("issues")
        assert not any("Spoon-Knife" in r.path for r in server.log[before:])


# -- Procore ---------------------------------------------------------------------------------


PROJECTS = (1100417, 1100562, 1100733)


def procore_config(server: ProviderServer) -> dict[str, Any]:
    return {"company_id": 8089, "base_url": server.url, "token_url": f"{server.url}/oauth/token"}


def test_procore_deletions_and_inactive_projects_are_found_by_the_next_sync(
    command: Cli, workers: Callable[[int], list[WorkerProcess]]
) -> None:
    fake = procore.Procore()
    for project in PROJECTS:
        fake.project(project, rfis=12)
    with ProviderServer(fake.answer) as server:
        pc = Connection(command, "procore", procore_config(server), fake.credentials())
        workers(1)
        assert pc.sync()["status"] == "succeeded"

        # One RFI moved to the recycle bin, one purged: tombstoned by the next sync.
        harbor = fake.projects[PROJECTS[0]]
        recycled, purged = sorted(harbor.rfis)[:2]
        harbor.recycled.add(recycled)
        del harbor.rfis[purged]
        assert pc.sync()["status"] == "succeeded"
        assert pc.tombstoned("rfis") == {str(recycled), str(purged)}

        # Nothing changed: one request per table and project (each fits on a page), and the
        # token's refresh.
        before = len(server.log)
        assert pc.sync()["status"] == "succeeded"
        asked = [r.path.split("?")[0] for r in server.log[before:] if r.path != "/oauth/token"]
        assert sorted(asked) == sorted(
            ["/rest/v1.0/companies", "/rest/v1.0/projects"]
            + [f"/rest/v1.0/projects/{p}/rfis" for p in PROJECTS]
        )

        # A project made inactive leaves the company's listing: its 12 RFIs go with it.
        fake.projects[PROJECTS[2]].active = False
        assert pc.sync()["status"] == "succeeded"
        inactive = {str(i) for i in fake.projects[PROJECTS[2]].rfis}
        assert len(inactive) == 12 and inactive <= pc.tombstoned("rfis")
        assert str(PROJECTS[2]) in pc.tombstoned("projects")


# -- Microsoft Graph -------------------------------------------------------------------------


def test_graph_deletions_come_from_the_delta_feed_and_a_window_holds_the_downloads(
    command: Cli, workers: Callable[[int], list[WorkerProcess]]
) -> None:
    fake = graph.Graph()
    fake.add(120)
    with ProviderServer(fake.answer) as server:
        fake.base = server.url
        drive = Connection(command, "msgraph_drive", fake.config(), graph.CLIENT)
        workers(2)
        # The first sync queues the files' downloads; once they are under way, the next sync's
        # delta query is throttled.
        assert drive.sync()["status"] == "succeeded"
        until(lambda: server.requests("/download/"), server.answered)
        server.throttle(WINDOW, matches=lambda r: r.url.path.endswith("/root/delta"))
        fake.delete("item-0007")
        assert drive.sync()["status"] == "succeeded"
        assert drive.tombstoned("drive_items") == {"item-0007"}
        poll_until(lambda: not _pending_ingestions(command), timeout=300)
        no_request_inside(server)

        # Nothing changed: one delta request, answered "no changes".
        before = len(server.log)
        assert drive.sync()["status"] == "succeeded"
        asked = [r.path for r in server.log[before:] if "/oauth2/" not in r.path]
        assert len(asked) == 1 and "/root/delta" in asked[0]


def _pending_ingestions(command: Cli) -> int:
    found = command("ingestions", "list", "--limit", "1000", "--json").ok().json()
    return sum(1 for i in found if i["status"] in ("queued", "running"))
