"""Files through the SDK contract, on the simulated provider's document store: file rows sync
into records like any other (hash-skipped, tombstoned), each stored row describes its file
(scope and content hash), and its content streams to a temporary file given only the stored
row and the connection's config and credentials, on a download server that refuses the token."""

from __future__ import annotations

import hashlib
import io
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pypdf import PdfReader

from connectors import Connector, File, FileGone, RateLimited, Table, register
from connectors.registry import unregister
from connectors.simulated import SimulatedConfig, SimulatedDocs
from connectors.simulated.documents import generate, kind_of
from connectors.simulated.server import Simulation, Tenant, start_server
from connectors.testing import FakeContext
from sync import Engine
from sync.testing import run_sync

AUTH = {"Authorization": "Bearer sim-acme"}
TABLE = SimulatedDocs.tables[0]


@pytest.fixture
def simulation() -> Simulation:
    simulation = Simulation()
    simulation.add_tenant("acme", size=120, seed=7)  # 12 files
    return simulation


@pytest.fixture
def server(simulation: Simulation) -> Iterator[str]:
    url, stop = start_server(simulation)
    yield url
    stop()


def acme(simulation: Simulation) -> Tenant:
    return simulation.tenant("acme")


def docs(server: str) -> tuple[SimulatedDocs, FakeContext]:
    """The connector as an ingestion job would make it: the connection's config and credentials,
    and nothing of the listing that produced the rows."""
    config = SimulatedConfig(base_url=server, tenant="acme")
    context = FakeContext(config=config, credentials={"token": "sim-acme"})
    return SimulatedDocs(context), context


def fetch(connector: SimulatedDocs, record: dict[str, Any]) -> bytes:
    with tempfile.TemporaryFile() as out:
        connector.download(TABLE, record, out, max_bytes=1024 * 1024)
        out.seek(0)
        return out.read()


# -- the provider --------------------------------------------------------------------------


def test_files_of_every_kind_and_their_content_are_deterministic(simulation: Simulation) -> None:
    files = acme(simulation).rows("files")
    assert len(files) == 12
    assert {f["kind"] for f in files} == {"txt", "md", "html", "pdf", "zip"}
    twin = Simulation().add_tenant("acme", size=120, seed=7)
    for row in files:
        content = acme(simulation).content(row["id"])
        assert content is not None and content == twin.content(row["id"])
        assert hashlib.sha256(content.content).hexdigest() == row["sha256"]
        assert (len(content.content), content.name) == (row["size"], row["name"])
    other = Simulation().add_tenant("acme", size=120, seed=8)
    assert other.content(1) != acme(simulation).content(1)


def test_pdfs_are_real_pdfs_and_zips_real_archives() -> None:
    pdf = generate(4, 1, "7:acme")
    assert kind_of(4) == "pdf" and pdf.media_type == "application/pdf"
    reader = PdfReader(io.BytesIO(pdf.content), strict=True)
    assert len(reader.pages) >= 2
    first = reader.pages[0].extract_text()
    assert first.split("\n")[0].endswith(".") and len(first) > 500
    archive = generate(5, 1, "7:acme")
    with zipfile.ZipFile(io.BytesIO(archive.content)) as opened:
        assert opened.testzip() is None
        assert opened.namelist() == [
            "readme.txt",
            "submittals/5-shop-drawings.md",
            "submittals/5-product-data.txt",
        ]
    assert generate(5, 1, "7:acme").content == archive.content  # fixed timestamps


def test_content_redirects_to_a_download_server_that_refuses_the_token(
    server: str, simulation: Simulation
) -> None:
    row = acme(simulation).rows("files")[0]
    found = httpx.get(f"{server}/docs/acme/files/{row['id']}/content", headers=AUTH)
    assert found.status_code == 302
    location = httpx.URL(found.headers["location"])
    assert (location.host, location.path.startswith("/_downloads/acme/")) == ("127.0.0.1", True)
    assert location.port != httpx.URL(server).port  # another origin
    refused = httpx.get(location, headers=AUTH)
    assert refused.status_code == 400 and "Authorization" in refused.json()["error"]
    served = httpx.get(location)
    assert served.status_code == 200
    assert hashlib.sha256(served.content).hexdigest() == row["sha256"]
    assert served.headers["content-type"] == "text/plain; charset=utf-8"
    forged = str(location)[:-4] + "0000"
    assert httpx.get(forged).status_code == 403


def test_content_without_redirects_and_for_a_deleted_file(
    server: str, simulation: Simulation
) -> None:
    tenant = acme(simulation)
    tenant.configure(content_redirect=False)
    row = tenant.rows("files")[3]
    direct = httpx.get(f"{server}/docs/acme/files/{row['id']}/content", headers=AUTH)
    assert direct.status_code == 200 and direct.headers["content-type"] == "application/pdf"
    assert hashlib.sha256(direct.content).hexdigest() == row["sha256"]
    deleted = tenant.advance()["files"]["deleted"][0]
    assert httpx.get(f"{server}/docs/acme/files/{deleted}/content", headers=AUTH).status_code == 404


def test_a_generation_changes_moves_deletes_and_adds_files(simulation: Simulation) -> None:
    tenant = acme(simulation)
    before = {row["id"]: row for row in tenant.rows("files")}
    changes = tenant.advance()["files"]
    after = {row["id"]: row for row in tenant.rows("files")}
    assert all(changes[k] for k in ("added", "updated", "moved", "deleted"))
    assert set(changes["deleted"]).isdisjoint(after)
    for i in changes["updated"]:
        assert after[i]["version"] == before[i]["version"] + 1
        assert after[i]["sha256"] != before[i]["sha256"]
        assert after[i]["project_id"] == before[i]["project_id"]
    for i in changes["moved"]:
        assert after[i]["project_id"] != before[i]["project_id"]
        assert after[i]["project_id"] in {p["id"] for p in tenant.rows("projects")}
        assert (after[i]["sha256"], after[i]["version"]) == (before[i]["sha256"], 1)
    assert changes == Simulation().add_tenant("acme", size=120, seed=7).advance()["files"]


# -- the SDK contract, through the engine --------------------------------------------------


def test_file_rows_sync_describe_and_download_from_the_stored_row(
    sync_engine: Engine, server: str, simulation: Simulation
) -> None:
    ws = sync_engine.create_workspace("acme-docs")
    conn = sync_engine.create_connection(
        ws.id,
        "documents",
        "simulated_docs",
        config={"base_url": server, "tenant": "acme", "page_size": 5},
        credentials={"token": "sim-acme"},
    )
    run = run_sync(sync_engine, conn.id)
    assert run.status == "succeeded", run.error
    assert run.results["files"]["upserted"] == 12

    def stored() -> dict[str, File]:
        described = {}
        for record in sync_engine.records(conn.id, "files"):
            file = SimulatedDocs.describe_file(TABLE, record.data)
            assert file is not None
            described[record.external_id] = file
        return described

    first = stored()
    rows = {str(row["id"]): row for row in acme(simulation).rows("files")}
    assert set(first) == set(rows)
    for key, file in first.items():
        assert file.scope == f"project:{rows[key]['project_id']}"
        assert file.version == f"sha256:{rows[key]['sha256']}"
        assert (file.name, file.media_type, file.size) == (
            rows[key]["name"],
            rows[key]["media_type"],
            rows[key]["size"],
        )

    # The content, fetched by a connector that knows only the stored row: its hash is the
    # version the row declared, and the token never reached the download server.
    # (The worker's poll that ended the sync may have begun ingesting files already.)
    before = acme(simulation).describe()["stats"]["downloads"]
    connector, _ = docs(server)
    for record in sync_engine.records(conn.id, "files"):
        content = fetch(connector, record.data)
        assert f"sha256:{hashlib.sha256(content).hexdigest()}" == first[record.external_id].version
    stats = acme(simulation).describe()["stats"]
    assert (stats["downloads"] - before, stats["unauthorized"]) == (12, 0)

    # Upstream, a file's content changes, another moves to another project, one is deleted.
    changes = acme(simulation).advance()["files"]
    old_rows = {r.external_id: r for r in sync_engine.records(conn.id, "files")}
    run = run_sync(sync_engine, conn.id)
    assert run.status == "succeeded", run.error
    assert run.results["files"]["tombstoned"] == len(changes["deleted"])
    touched = len(changes["updated"]) + len(changes["moved"]) + len(changes["added"])
    assert run.results["files"]["upserted"] == touched
    moved_or_changed = len(changes["updated"]) + len(changes["moved"])
    assert run.results["files"]["unchanged"] == 12 - len(changes["deleted"]) - moved_or_changed
    second = stored()
    changed, moved, gone = (
        str(changes["updated"][0]),
        str(changes["moved"][0]),
        str(changes["deleted"][0]),
    )
    assert second[changed].version != first[changed].version
    assert second[changed].scope == first[changed].scope
    assert second[moved].scope != first[moved].scope
    assert second[moved].version == first[moved].version
    assert gone not in second
    tombstoned = {
        r.external_id
        for r in sync_engine.records(conn.id, "files", include_deleted=True)
        if r.deleted_at is not None
    }
    assert gone in tombstoned
    with pytest.raises(FileGone, match=r"\(file \d+\) was deleted; the next sync tombstones it"):
        fetch(connector, old_rows[gone].data)


def test_a_rate_limited_content_request_waits_then_downloads(
    server: str, simulation: Simulation
) -> None:
    tenant = acme(simulation)
    tenant.configure(retry_after=3)
    record = tenant.rows("files")[1]
    connector, context = docs(server)
    tenant.script_faults("429")
    content = fetch(connector, record)
    assert hashlib.sha256(content).hexdigest() == record["sha256"]
    assert context.slept == [3.0]
    tenant.configure(retry_after=3600)
    tenant.script_faults("429")
    with pytest.raises(RateLimited):
        fetch(connector, record)


def test_a_connector_that_declares_files_must_say_how_to_read_them() -> None:
    class Listing(Connector):
        provider = "files_without_download"
        tables = (Table("documents", files=True),)

        @classmethod
        def describe_file(cls, table: Table, record: Any) -> File | None:
            return File(name=record["name"], scope="all")

    with pytest.raises(TypeError, match=r"table 'documents' but does not implement download\(\)"):
        register(Listing)
    unregister("files_without_download")

    class Plain(Connector):
        provider = "files_without_either"
        tables = (Table("documents", files=True),)

    with pytest.raises(TypeError, match=r"describe_file\(\) and download\(\)"):
        register(Plain)
    unregister("files_without_either")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "", "scope": "p"}, "a file needs a name"),
        ({"name": "a.pdf", "scope": ""}, "needs a scope"),
        ({"name": "a.pdf", "scope": "p", "size": -1}, "negative size"),
    ],
)
def test_a_file_must_have_a_name_a_scope_and_a_size_of_zero_or_more(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        File(**fields)
