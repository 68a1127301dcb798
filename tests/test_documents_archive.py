"""ZIP expansion refuses zip bombs, path traversal, links, encrypted members and deep nesting,
with one clear line each, and leaves no temporary file behind; every archive is built here."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import pytest

from sync.documents import ArchiveRefused, DocumentLimits, MalformedDocument, expand_zip
from tests.documents_fixtures import zip_bytes

LIMITS = DocumentLimits()


@pytest.fixture(autouse=True)
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary files go here, so each test can check that none is left."""
    directory = tmp_path / "spool"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def _archive(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "upload.zip"
    path.write_bytes(data)
    return path


def _expand(path: Path, limits: DocumentLimits = LIMITS) -> dict[str, bytes]:
    return {
        m.path: m.content.path.read_bytes() for m in expand_zip(path, limits, name="upload.zip")
    }


def test_members_are_expanded_with_relative_paths(tmp_path: Path, spool_dir: Path) -> None:
    path = _archive(
        tmp_path,
        zip_bytes(
            [("docs/", b""), ("docs/a.txt", b"alpha"), ("./b.md", b"# beta"), ("c\\d.txt", b"d")]
        ),
    )
    assert _expand(path) == {"docs/a.txt": b"alpha", "b.md": b"# beta", "c/d.txt": b"d"}
    assert list(spool_dir.iterdir()) == []


def test_a_member_lives_until_the_next_is_asked_for(tmp_path: Path, spool_dir: Path) -> None:
    path = _archive(tmp_path, zip_bytes([("a.txt", b"a"), ("b.txt", b"b")]))
    members = expand_zip(path, LIMITS)
    first = next(members)
    assert first.content.path.exists() and first.size == 1 and first.depth == 0
    next(members)
    assert not first.content.path.exists()
    members.close()
    assert list(spool_dir.iterdir()) == []


def test_a_nested_archive_is_expanded_in_place(tmp_path: Path) -> None:
    inner = zip_bytes([("inside.txt", b"deep")])
    path = _archive(tmp_path, zip_bytes([("outer.txt", b"top"), ("sub/inner.zip", inner)]))
    members = list(expand_zip(path, LIMITS))
    assert [(m.path, m.depth) for m in members] == [
        ("outer.txt", 0),
        ("sub/inner.zip/inside.txt", 1),
    ]


def test_nesting_deeper_than_the_setting_is_refused(tmp_path: Path, spool_dir: Path) -> None:
    innermost = zip_bytes([("x.txt", b"x")])
    middle = zip_bytes([("innermost.zip", innermost)])
    path = _archive(tmp_path, zip_bytes([("middle.zip", middle)]))
    with pytest.raises(ArchiveRefused) as caught:
        _expand(path)
    assert str(caught.value) == (
        "upload.zip: middle.zip/innermost.zip is an archive nested more than 1 deep; raise "
        "CONNECTOR_SYNC_DOCUMENTS_ARCHIVE_MAX_DEPTH or expand it first"
    )
    assert set(_expand(path, DocumentLimits(archive_max_depth=2))) == {
        "middle.zip/innermost.zip/x.txt"
    }
    assert list(spool_dir.iterdir()) == []


@pytest.mark.parametrize(
    "name", ["../evil.txt", "docs/../../evil.txt", "/etc/passwd", "C:/x.txt", "..\\evil.txt"]
)
def test_paths_that_escape_are_refused(tmp_path: Path, name: str) -> None:
    path = _archive(tmp_path, zip_bytes([("fine.txt", b"ok"), (name, b"evil")]))
    with pytest.raises(ArchiveRefused, match="has a path that escapes the archive"):
        _expand(path)


def test_symbolic_links_are_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path, zip_bytes([("link", b"/etc/passwd")], symlinks=["link"]))
    with pytest.raises(
        ArchiveRefused, match=r"^upload.zip: link is a symbolic link; links are refused$"
    ):
        _expand(path)


def test_encrypted_members_are_refused(tmp_path: Path) -> None:
    path = _archive(
        tmp_path, zip_bytes([("a.txt", b"a"), ("secret.txt", b"s")], encrypted=["secret.txt"])
    )
    with pytest.raises(
        ArchiveRefused, match=r"secret.txt is encrypted; upload an archive without a password"
    ):
        _expand(path)


def test_a_compression_bomb_is_refused(tmp_path: Path, spool_dir: Path) -> None:
    path = _archive(tmp_path, zip_bytes([("zeros.bin", bytes(20 * 1024 * 1024))]))
    with pytest.raises(
        ArchiveRefused, match=r"zeros.bin expands more than 100 times its compressed size"
    ):
        _expand(path)
    assert list(spool_dir.iterdir()) == []


def test_a_bomb_whose_headers_lie_is_refused_while_expanding(
    tmp_path: Path, spool_dir: Path
) -> None:
    """A size rewritten in the central directory to look harmless is not believed."""
    data = bytearray(zip_bytes([("zeros.bin", bytes(20 * 1024 * 1024))]))
    with zipfile.ZipFile(_archive(tmp_path, bytes(data))) as archive:
        info = archive.infolist()[0]
    central = data.rindex(b"PK\x01\x02")
    data[central + 24 : central + 28] = (1000).to_bytes(4, "little")  # uncompressed size
    path = _archive(tmp_path, bytes(data))
    # zipfile stops at the declared size, and the member then fails its CRC check.
    with pytest.raises(MalformedDocument, match=r"^upload.zip: zeros.bin is damaged \(Bad CRC-32"):
        _expand(path)
    assert info.file_size == 20 * 1024 * 1024
    assert list(spool_dir.iterdir()) == []


def test_the_total_expanded_size_is_capped(tmp_path: Path, spool_dir: Path) -> None:
    members = [(f"part{i}.bin", bytes(range(256)) * 400) for i in range(5)]  # 100 KB each
    path = _archive(tmp_path, zip_bytes(members, compression=zipfile.ZIP_STORED))
    with pytest.raises(ArchiveRefused) as caught:
        _expand(path, DocumentLimits(archive_max_total_bytes=300_000))
    assert str(caught.value) == (
        "upload.zip expands to more than 300,000 bytes; raise "
        "CONNECTOR_SYNC_DOCUMENTS_ARCHIVE_MAX_TOTAL_BYTES or split it"
    )
    assert len(_expand(path, DocumentLimits(archive_max_total_bytes=600_000))) == 5
    assert list(spool_dir.iterdir()) == []


def test_the_member_count_is_capped_nested_archives_included(tmp_path: Path) -> None:
    inner = zip_bytes([(f"in{i}.txt", b"x") for i in range(3)])
    path = _archive(tmp_path, zip_bytes([("a.txt", b"a"), ("inner.zip", inner)]))
    with pytest.raises(ArchiveRefused, match="holds more than 4 files"):
        _expand(path, DocumentLimits(archive_max_members=4))
    assert len(_expand(path, DocumentLimits(archive_max_members=5))) == 4


def test_two_members_with_one_path_are_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path, zip_bytes([("a.txt", b"1"), ("./a.txt", b"2")]))
    with pytest.raises(ArchiveRefused, match=r"two members are named a.txt"):
        _expand(path)


def test_a_file_that_is_not_a_zip_is_refused(tmp_path: Path) -> None:
    path = _archive(tmp_path, b"PK\x03\x04 but not really a zip")
    with pytest.raises(MalformedDocument, match=r"^upload.zip is not a readable ZIP archive"):
        _expand(path)
