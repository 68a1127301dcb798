"""The files example in docs/writing-a-connector.md works as written: extracted, imported, and run
offline against mocked responses, the redirect to a storage host and a deleted file included."""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import respx

from connectors import File, FileGone, get
from connectors.registry import unregister
from connectors.testing import FakeContext, read_table

DOC = Path(__file__).parent.parent / "docs" / "writing-a-connector.md"
BLOCK = re.compile(r"```python\n# acme_attachments\.py \(files example\)\n(.*?)```", re.DOTALL)
API = "https://api.acme-tasks.example"
STORAGE = "https://acme-files.s3.eu-west-1.amazonaws.test"
ATTACHMENTS = [
    {"id": 40, "type": "folder", "project_id": 1, "folder_id": None, "file_name": "Drawings"},
    {
        "id": 42,
        "type": "file",
        "project_id": 1,
        "folder_id": 40,
        "file_name": "Level 2 slab.pdf",
        "content_type": "application/pdf",
        "byte_size": 11,
        "sha256": "5d41402abc4b2a76b9719d911017c592",
    },
]


@pytest.fixture
def example(tmp_path: Path) -> Iterator[ModuleType]:
    (source,) = BLOCK.findall(DOC.read_text())
    path = tmp_path / "acme_attachments.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("acme_attachments", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["acme_attachments"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("acme_attachments", None)
        unregister("acme_attachments")


def test_the_files_example_lists_describes_and_downloads(
    example: ModuleType, respx_mock: respx.MockRouter
) -> None:
    respx_mock.get(f"{API}/projects/p1/attachments").respond(json=ATTACHMENTS)
    content = respx_mock.get(f"{API}/attachments/42/content").respond(
        302, headers={"Location": f"{STORAGE}/p1/42?X-Amz-Signature=0f1e2d3c"}
    )
    storage = respx_mock.get(f"{STORAGE}/p1/42").respond(
        200, content=b"%PDF-1.7 ok", headers={"Content-Type": "application/pdf"}
    )
    context = FakeContext(
        config=example.AcmeAttachmentsConfig(project="p1"), credentials={"token": "t0k3n-abc"}
    )
    connector = example.AcmeAttachments(context)
    table = connector.tables[0]

    rows = read_table(connector, table)
    described = [connector.describe_file(table, row) for row in rows]
    assert described == [
        None,
        File(
            name="Level 2 slab.pdf",
            scope="project:1/folder:40",
            media_type="application/pdf",
            size=11,
            version="sha256:5d41402abc4b2a76b9719d911017c592",
        ),
    ]
    with tempfile.TemporaryFile() as out:
        got = connector.download(table, rows[1], out, max_bytes=1024)
        out.seek(0)
        assert out.read() == b"%PDF-1.7 ok" and got.size == 11
    assert content.calls.last.request.headers["authorization"] == "Bearer t0k3n-abc"
    assert "authorization" not in storage.calls.last.request.headers

    respx_mock.get(f"{API}/attachments/42/content").respond(404, json={"error": "not found"})
    with tempfile.TemporaryFile() as out, pytest.raises(FileGone, match="was deleted from Acme"):
        connector.download(table, rows[1], out, max_bytes=1024)
    connector.close()


def test_the_example_connector_is_registered_with_its_files_table(example: ModuleType) -> None:
    assert get("acme_attachments") is example.AcmeAttachments
    assert [t.name for t in example.AcmeAttachments.tables if t.files] == ["attachments"]
