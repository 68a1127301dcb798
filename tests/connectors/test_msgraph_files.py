"""Microsoft Graph drive items as files: which items are files, their version and scope, and
their content through `GET /drives/{drive-id}/items/{item-id}/content`, shaped as Graph's
"Download driveItem content" docs describe it: a 302 whose Location is a pre-authenticated URL
on another host, that host's 200, a 404 `itemNotFound` for an item deleted since it was listed,
and a 429 with Retry-After while Graph throttles."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import httpx
import pytest
import respx

from connectors import FileGone, PermanentError, RateLimited
from connectors.files import File
from connectors.msgraph import GraphDriveConnector, file_version
from connectors.testing import read_table
from sync import Engine
from sync.testing import run_sync
from tests.connectors.helpers import fixture
from tests.connectors.test_msgraph import (
    DELTA,
    DELTA_LINK,
    DRIVE,
    GRAPH,
    NEXT_LINK,
    TOKEN_URL,
    connect,
    delta_route,
    graph,
    offline,
    token,
)

TABLE = GraphDriveConnector.tables[0]
SPEC = "01BYE5RZ2KXWOTNNU3ZFAJ5K2BDQQFJ5FN"  # Pump station spec.docx, in Specifications
SITE_PLAN = "01BYE5RZ7JDQ2XYZP6KRG3ZU5LJEWRP4QA"  # Site plan rev C.pdf, at the root
ROOT = "01BYE5RZ56Y2GOVW7725BZO354PWSELRRZ"
SPECIFICATIONS = "01BYE5RZ6QN3ZWBTUFOFD3GSPGOHDJD36K"
CONTENT_URL = f"{GRAPH}/drives/{DRIVE}/items/{SITE_PLAN}/content"
# What Graph's Location points at for a SharePoint document library: the token is in the query.
DOWNLOAD_HOST = "https://contoso.sharepoint.com"
DOWNLOAD_PATH = "/sites/Engineering/_layouts/15/download.aspx"
DOWNLOAD_URL = (
    f"{DOWNLOAD_HOST}{DOWNLOAD_PATH}?UniqueId=5c0d2a6e-1b8f-4f2e-9a51-3f7c2d0e8b41"
    "&Translate=false&tempauth=eyJ0eXAiOiJKV1QiLCJhbGciOiJub25lIn0.eyJhdWQiOiJzcCJ9.&ApiVersion=2.0"
)
PDF = b"%PDF-1.7\n" + b"site plan rev C " * 4096 + b"\n%%EOF\n"


def items() -> dict[str, dict[str, Any]]:
    listed = fixture("msgraph", "delta_page1.json")["value"]
    listed += fixture("msgraph", "delta_page2.json")["value"]
    return {item["id"]: item for item in listed}


def graph_error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    """An error as Graph sends one: the code and message in `error`, ids in `innerError`."""
    body = {
        "error": {
            "code": code,
            "message": message,
            "innerError": {
                "date": "2024-05-06T09:31:02",
                "request-id": "8a3f6c1e-5d2b-4e7a-9c0f-1b2d3e4f5a6b",
                "client-request-id": "8a3f6c1e-5d2b-4e7a-9c0f-1b2d3e4f5a6b",
            },
        }
    }
    return graph(body, status, headers)


def found() -> httpx.Response:
    """Graph's answer to `/content`: 302 Found to the pre-authenticated URL, no body."""
    return httpx.Response(302, headers={"Location": DOWNLOAD_URL, "Content-Length": "0"})


def served_pdf() -> httpx.Response:
    return httpx.Response(
        200,
        content=PDF,
        headers={
            "Content-Type": "application/pdf",
            "Content-Disposition": 'attachment; filename="Site plan rev C.pdf"',
            "ETag": '"{JEWRP4QA-0000-0000-0000-000000000000},1"',
        },
    )


# -- which items are files -----------------------------------------------------------------


def test_files_are_items_with_the_file_facet_and_folders_are_not() -> None:
    listed = items()
    assert GraphDriveConnector.describe_file(TABLE, listed[ROOT]) is None
    assert GraphDriveConnector.describe_file(TABLE, listed[SPECIFICATIONS]) is None
    assert GraphDriveConnector.describe_file(TABLE, listed[SPEC]) == File(
        name="Pump station spec.docx",
        scope=f"drive:{DRIVE}/folder:{SPECIFICATIONS}",
        media_type="application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        size=84213,
        version="quickXorHash:bB0pyL4xvSoeH6u5Pz6cqkOAwTE=",
    )
    plan = GraphDriveConnector.describe_file(TABLE, listed[SITE_PLAN])
    assert plan is not None and plan.scope == f"drive:{DRIVE}/folder:{ROOT}"


def test_the_version_is_the_strongest_content_signal_graph_gives() -> None:
    item = items()[SPEC]
    item["file"]["hashes"] = {"quickXorHash": "q", "sha1Hash": "s1", "sha256Hash": "s256"}
    assert file_version(item) == "sha256Hash:s256"
    del item["file"]["hashes"]  # OneDrive for Business omits cTag in delta: the eTag is left
    assert file_version(item) == item["cTag"]
    del item["cTag"]
    assert file_version(item) == item["eTag"]


def test_a_file_moved_to_another_folder_changes_scope_and_not_version() -> None:
    before = items()[SPEC]
    after = {**before, "parentReference": {**before["parentReference"], "id": ROOT}}
    old = GraphDriveConnector.describe_file(TABLE, before)
    new = GraphDriveConnector.describe_file(TABLE, after)
    assert old is not None and new is not None
    assert (old.version, old.scope != new.scope) == (new.version, True)


def test_a_file_item_without_a_name_is_a_clear_error() -> None:
    item = items()[SPEC]
    del item["name"]
    with pytest.raises(PermanentError, match=f"drive item {SPEC} has a file facet but no name"):
        GraphDriveConnector.describe_file(TABLE, item)


def test_pre_authenticated_download_urls_are_never_stored(respx_mock: respx.MockRouter) -> None:
    body = {"value": list(items().values()), "@odata.deltaLink": DELTA_LINK}
    body["value"][2]["@microsoft.graph.downloadUrl"] = DOWNLOAD_URL
    respx_mock.get(DELTA).mock(return_value=graph(body))
    connector, _ = offline()
    records = [i for i in read_table(connector, "drive_items") if isinstance(i, dict)]
    assert len(records) == 5
    assert not any("downloadUrl" in key for record in records for key in record)


def test_file_rows_sync_like_any_record_and_describe_from_storage(
    sync_engine: Engine, respx_mock: respx.MockRouter
) -> None:
    respx_mock.post(TOKEN_URL).mock(return_value=token("graph-token-1"))
    respx_mock.get(DELTA).mock(return_value=graph(fixture("msgraph", "delta_page1.json")))
    delta_route(respx_mock, NEXT_LINK).mock(
        return_value=graph(fixture("msgraph", "delta_page2.json"))
    )
    conn_id = connect(sync_engine)
    assert run_sync(sync_engine, conn_id).status == "succeeded"

    stored = {r.external_id: r.data for r in sync_engine.records(conn_id, "drive_items")}
    files = {
        key: described
        for key, data in stored.items()
        if (described := GraphDriveConnector.describe_file(TABLE, data)) is not None
    }
    assert set(files) == {SPEC, SITE_PLAN, "01BYE5RZ4HPYPF4QSZ6BCJJ42DPZ4TWL3J"}
    assert files[SITE_PLAN].version == "quickXorHash:Wc7rP1a0b7QG4fPzOQ5pE2mA0xI="
    assert files[SITE_PLAN].scope == f"drive:{DRIVE}/folder:{ROOT}"


# -- content -------------------------------------------------------------------------------


def test_content_follows_the_302_without_the_access_token(respx_mock: respx.MockRouter) -> None:
    content = respx_mock.get(CONTENT_URL).mock(return_value=found())
    download = respx_mock.get(f"{DOWNLOAD_HOST}{DOWNLOAD_PATH}").mock(return_value=served_pdf())
    connector, _ = offline()
    out = io.BytesIO()

    result = connector.download(TABLE, items()[SITE_PLAN], out, max_bytes=10 * 1024 * 1024)

    assert out.getvalue() == PDF
    assert (result.status, result.size, result.media_type) == (200, len(PDF), "application/pdf")
    assert result.sha256 == hashlib.sha256(PDF).hexdigest()
    assert content.calls.last.request.headers["authorization"] == "Bearer graph-token-1"
    sent = download.calls.last.request
    assert "authorization" not in sent.headers
    assert sent.url.params["tempauth"].startswith("eyJ0eXAi")  # the URL is its own credential


def test_a_deleted_item_is_gone_not_a_failure_to_retry(respx_mock: respx.MockRouter) -> None:
    respx_mock.get(CONTENT_URL).mock(
        return_value=graph_error(404, "itemNotFound", "The resource could not be found.")
    )
    connector, _ = offline()
    out = io.BytesIO()
    with pytest.raises(FileGone, match=r"Site plan rev C\.pdf .* the next sync tombstones it"):
        connector.download(TABLE, items()[SITE_PLAN], out, max_bytes=1024 * 1024)
    assert out.getvalue() == b""


def test_a_410_on_content_is_gone_too(respx_mock: respx.MockRouter) -> None:
    respx_mock.get(CONTENT_URL).mock(
        return_value=graph_error(410, "resourceModified", "The resource has been deleted.")
    )
    connector, _ = offline()
    with pytest.raises(FileGone, match="is no longer in the drive"):
        connector.download(TABLE, items()[SITE_PLAN], io.BytesIO(), max_bytes=1024)


def test_a_throttled_content_request_waits_for_retry_after(respx_mock: respx.MockRouter) -> None:
    throttled = graph_error(
        429, "activityLimitReached", "The request has been throttled", **{"Retry-After": "5"}
    )
    content = respx_mock.get(CONTENT_URL).mock(side_effect=[throttled, found()])
    respx_mock.get(f"{DOWNLOAD_HOST}{DOWNLOAD_PATH}").mock(return_value=served_pdf())
    connector, context = offline()
    out = io.BytesIO()

    connector.download(TABLE, items()[SITE_PLAN], out, max_bytes=1024 * 1024)

    assert context.slept == [5.0] and content.call_count == 2
    assert out.getvalue() == PDF


def test_a_long_throttle_ends_the_attempt_with_the_wait(respx_mock: respx.MockRouter) -> None:
    respx_mock.get(CONTENT_URL).mock(
        return_value=graph_error(
            429, "activityLimitReached", "The request has been throttled", **{"Retry-After": "315"}
        )
    )
    connector, context = offline()
    with pytest.raises(RateLimited) as raised:
        connector.download(TABLE, items()[SITE_PLAN], io.BytesIO(), max_bytes=1024 * 1024)
    assert raised.value.retry_after == 315.0 and context.slept == []


def test_a_file_over_the_limit_is_refused(respx_mock: respx.MockRouter) -> None:
    respx_mock.get(CONTENT_URL).mock(return_value=found())
    respx_mock.get(f"{DOWNLOAD_HOST}{DOWNLOAD_PATH}").mock(return_value=served_pdf())
    connector, _ = offline()
    out = io.BytesIO()
    with pytest.raises(PermanentError, match="over the limit of 1,024 bytes") as raised:
        connector.download(TABLE, items()[SITE_PLAN], out, max_bytes=1024)
    assert "tempauth" not in str(raised.value) and out.getvalue() == b""


def test_a_folder_has_no_content_to_download() -> None:
    connector, _ = offline()
    with pytest.raises(PermanentError, match=f"drive item {SPECIFICATIONS} is not a file"):
        connector.download(TABLE, items()[SPECIFICATIONS], io.BytesIO(), max_bytes=1)
