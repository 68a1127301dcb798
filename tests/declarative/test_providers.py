"""Declared providers in the database: a file is checked (each mistake at its line, nothing
stored), stored as its provider's next version (runs already started finish on theirs),
loaded by workers that were running before it was added, never shadows a plugin, and is
removed only once no connection uses it, also against a connection created meanwhile."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import psycopg
import pytest

from connectors.declarative import ProviderFileError
from sync import Engine
from sync.errors import Conflict, NotFound
from sync.testing import make_run_due, run_sync
from tests.conftest import DIRECT_URL
from tests.declarative.helpers import API
from tests.waiting import wait_until_blocked

V1 = """
provider: tiny_api
config: {base_url: {type: string}}
base_url: "{config.base_url}"
tables:
  - name: users
    path: /users
"""
V2 = V1.replace("path: /users", "path: /v2/users")

BAD = """\
provider: tiny_api
config:
  base_url: {type: strng}
base_url: "{config.base_url}"
paginator: {type: link_header, size: 3}
tables:
  - name: users
    primary_key: id
"""


def connection(engine: Engine, provider: str = "tiny_api") -> int:
    ws = engine.create_workspace("w")
    return engine.create_connection(ws.id, "c", provider, config={"base_url": API}).id


def stored_versions(admin: Any) -> list[Any]:
    return admin.execute("SELECT name, version FROM declared_provider_versions").fetchall()


def test_a_bad_file_names_each_mistake_at_its_line_and_stores_nothing(
    engine: Engine, admin: Any
) -> None:
    with pytest.raises(ProviderFileError) as refused:
        engine.add_provider(BAD)
    found = [(m.line, m.where) for m in refused.value.mistakes]
    assert found == [
        (3, "config.base_url.type"),
        (5, "paginator.size"),
        (7, "tables[0].path"),
    ]
    assert "required" in refused.value.mistakes[2].message
    assert stored_versions(admin) == []
    assert engine.declared_providers() == []


def test_a_file_that_means_nothing_together_is_refused_at_its_lines(engine: Engine) -> None:
    text = V1 + "  - name: orders\n    path: /u/{users.id}/o/{credentials.token}\n"
    with pytest.raises(ProviderFileError) as refused:
        engine.add_provider(text)
    (mistake,) = refused.value.mistakes
    assert mistake.line == 9 and "credentials go only in auth" in mistake.message


def test_a_declared_provider_may_not_take_a_plugins_name(engine: Engine, admin: Any) -> None:
    with pytest.raises(ProviderFileError) as refused:
        engine.add_provider(V1.replace("tiny_api", "simulated"))
    assert refused.value.mistakes[0].line == 2
    assert "installed plugin" in refused.value.mistakes[0].message
    assert stored_versions(admin) == []


def test_a_run_finishes_on_the_version_it_started_on(engine: Engine, respx_mock: Any) -> None:
    old = respx_mock.get(f"{API}/users").mock(
        side_effect=[httpx.Response(500), httpx.Response(200, json=[{"id": 1}])]
    )
    new = respx_mock.get(f"{API}/v2/users").respond(json=[{"id": 1}, {"id": 2}])
    assert engine.add_provider(V1).version == 1
    conn = connection(engine)
    run = engine.sync(conn)
    worker = engine.worker(listen=False)
    worker.poll()  # attempt 1 fails (a 500): the run is queued for a retry
    assert engine.run(run.id).attempts == 1 and engine.run(run.id).status == "queued"

    assert engine.add_provider(V2).version == 2
    make_run_due(engine, run.id)
    worker.poll()
    done = engine.run(run.id)
    assert done.status == "succeeded" and done.results["users"]["upserted"] == 1
    assert old.call_count == 2 and not new.called  # both attempts on version 1

    assert run_sync(engine, conn, worker=worker).results["users"]["upserted"] == 1
    assert new.call_count == 1  # a new run takes version 2


def test_a_running_worker_loads_a_provider_added_after_it_started(
    engine: Engine, respx_mock: Any
) -> None:
    respx_mock.get(f"{API}/users").respond(json=[{"id": 1}])
    worker = engine.worker(listen=False)
    assert "tiny_api" not in worker.providers

    engine.add_provider(V1)
    conn = connection(engine)
    run = engine.sync(conn)
    assert not worker.poll()  # it does not claim a provider it has not loaded yet
    assert worker.provider_loader.run_once() == ["tiny_api"]
    worker.heartbeat.run_once()
    assert "tiny_api" in {p for w in engine.workers() for p in (w.providers or [])}
    assert worker.poll()
    assert engine.run(run.id).status == "succeeded"


def test_removal_is_refused_while_a_connection_uses_the_provider(
    engine: Engine, admin: Any
) -> None:
    engine.add_provider(V1)
    conn = connection(engine)
    with pytest.raises(Conflict, match="1 connection"):
        engine.remove_provider("tiny_api")
    assert len(stored_versions(admin)) == 1

    engine.delete_connection(conn)
    assert engine.worker(listen=False).poll()  # the purge removes the connection
    engine.remove_provider("tiny_api")
    assert stored_versions(admin) == [] and engine.declared_providers() == []
    with pytest.raises(NotFound):
        engine.remove_provider("tiny_api")


def test_a_connection_created_during_a_removal_is_refused(engine: Engine, schema: str) -> None:
    engine.add_provider(V1)
    ws = engine.create_workspace("w")
    engine.load_providers()
    created: list[Any] = []

    def create() -> None:
        try:
            engine.create_connection(ws.id, "late", "tiny_api", config={"base_url": API})
            created.append("created")
        except NotFound as exc:
            created.append(exc)

    # The removal holds the provider's row (its first step), as removing does until it commits.
    with psycopg.connect(DIRECT_URL, options=f"-c search_path={schema}") as removal:
        removal.execute("SELECT 1 FROM declared_providers WHERE name = 'tiny_api' FOR UPDATE")
        creating = threading.Thread(target=create)
        creating.start()
        wait_until_blocked(schema)
        removal.execute("DELETE FROM declared_providers WHERE name = 'tiny_api'")
        removal.commit()
    creating.join(30)
    (outcome,) = created
    assert isinstance(outcome, NotFound) and "removed" in str(outcome)
    assert engine.connections() == []
