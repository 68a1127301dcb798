"""Safe expansion of ZIP archives into member files, streamed: each member is decompressed to
a temporary file in blocks, and the caps are enforced on the bytes actually produced, not only
on what the archive's headers declare.

Refused, each with a one-line :class:`ArchiveRefused`:

- zip bombs: a member that expands more than ``archive_max_ratio`` times its compressed size
  (members smaller than ``archive_ratio_floor`` are exempt: tiny files compress absurdly well),
  or an archive that expands past ``archive_max_total_bytes`` or holds more than
  ``archive_max_members`` files, nested archives included;
- path traversal: an absolute path, a drive letter, a ``..`` component, or a symbolic link;
- two members with the same path (one would silently replace the other);
- encrypted members;
- an archive nested deeper than ``archive_max_depth`` (a ``.zip`` inside the archive is
  expanded in place, its members' paths prefixed with its own).

The central directory is checked first, so most refusals come before any member is yielded;
a member whose headers lie is refused while it is being decompressed. A caller that must not
act on part of a refused archive collects the members and acts once the expansion has ended.
"""

from __future__ import annotations

import stat
import zipfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sync.documents.errors import ArchiveRefused, MalformedDocument
from sync.documents.limits import DocumentLimits, env_name
from sync.documents.spool import BLOCK, SpooledFile, spool

_ENCRYPTED = 0x1
_UNIX = 3


@dataclass(frozen=True)
class ArchiveMember:
    """One member file. ``content`` is deleted when the next member is asked for (or the
    expansion ends): read or move it before then."""

    path: str  # relative, "/"-separated; a nested archive's members under "inner.zip/"
    depth: int  # 0: in the archive itself; 1: in an archive inside it; ...
    content: SpooledFile

    @property
    def size(self) -> int:
        return self.content.size


class _Budget:
    def __init__(self, limits: DocumentLimits) -> None:
        self.members = limits.archive_max_members
        self.bytes = limits.archive_max_total_bytes


def expand_zip(
    path: Path, limits: DocumentLimits, *, name: str = "the archive"
) -> Generator[ArchiveMember, None, None]:
    """The member files of the ZIP at ``path``, in archive order, nested archives expanded."""
    yield from _expand(path, limits, _Budget(limits), name=name, prefix="", depth=0)


def _expand(
    path: Path, limits: DocumentLimits, budget: _Budget, *, name: str, prefix: str, depth: int
) -> Iterator[ArchiveMember]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise MalformedDocument(
            f"{name} is not a readable ZIP archive ({exc}); check that the file is complete"
        ) from None
    with archive:
        files = _check_directory(archive, limits, budget, name=name, prefix=prefix)
        for info, member_path in files:
            nested = member_path.lower().endswith(".zip")
            if nested and depth + 1 > limits.archive_max_depth:
                raise ArchiveRefused(
                    f"{name}: {member_path} is an archive nested more than "
                    f"{limits.archive_max_depth} deep; raise {env_name('archive_max_depth')} "
                    "or expand it first"
                )
            content = _decompress(archive, info, limits, budget, name=name, path=member_path)
            try:
                if nested:
                    yield from _expand(
                        content.path,
                        limits,
                        budget,
                        name=name,
                        prefix=member_path + "/",
                        depth=depth + 1,
                    )
                else:
                    yield ArchiveMember(member_path, depth, content)
            finally:
                content.close()


def _check_directory(
    archive: zipfile.ZipFile, limits: DocumentLimits, budget: _Budget, *, name: str, prefix: str
) -> list[tuple[zipfile.ZipInfo, str]]:
    """Every refusal the central directory alone can justify, before anything is expanded."""
    files: list[tuple[zipfile.ZipInfo, str]] = []
    seen: set[str] = set()
    declared = 0
    for info in archive.infolist():
        member_path = prefix + _safe_path(info.filename, name=name)
        if info.create_system == _UNIX and stat.S_ISLNK(info.external_attr >> 16):
            raise ArchiveRefused(f"{name}: {member_path} is a symbolic link; links are refused")
        if info.is_dir():
            continue
        if info.flag_bits & _ENCRYPTED:
            raise ArchiveRefused(
                f"{name}: {member_path} is encrypted; upload an archive without a password"
            )
        if member_path in seen:
            raise ArchiveRefused(f"{name}: two members are named {member_path}")
        seen.add(member_path)
        _check_ratio(info.file_size, info, limits, name=name, path=member_path)
        declared += info.file_size
        files.append((info, member_path))
    if len(files) > budget.members:
        raise ArchiveRefused(
            f"{name} holds more than {limits.archive_max_members:,} files; raise "
            f"{env_name('archive_max_members')} or split it"
        )
    if declared > budget.bytes:
        _too_big(limits, name)
    budget.members -= len(files)
    return files


def _safe_path(raw: str, *, name: str) -> str:
    """A member's path as a relative POSIX path, or a refusal if it could escape."""
    text = raw.replace("\\", "/")
    if (
        text.startswith("/")
        or (len(text) > 1 and text[1] == ":")
        or "\x00" in text
        or ".." in text.split("/")
    ):
        raise ArchiveRefused(f"{name}: member {raw!r} has a path that escapes the archive")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if not parts:
        raise ArchiveRefused(f"{name}: a member has an empty path")
    return "/".join(parts) + ("/" if text.endswith("/") else "")


def _check_ratio(
    expanded: int, info: zipfile.ZipInfo, limits: DocumentLimits, *, name: str, path: str
) -> None:
    if expanded > limits.archive_ratio_floor and expanded > limits.archive_max_ratio * max(
        info.compress_size, 1
    ):
        raise ArchiveRefused(
            f"{name}: {path} expands more than {limits.archive_max_ratio} times its compressed "
            f"size (a zip bomb?); raise {env_name('archive_max_ratio')} if it is genuine"
        )


def _too_big(limits: DocumentLimits, name: str) -> None:
    raise ArchiveRefused(
        f"{name} expands to more than {limits.archive_max_total_bytes:,} bytes; raise "
        f"{env_name('archive_max_total_bytes')} or split it"
    )


def _decompress(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    limits: DocumentLimits,
    budget: _Budget,
    *,
    name: str,
    path: str,
) -> SpooledFile:
    def blocks() -> Iterator[bytes]:
        produced = 0
        try:
            with archive.open(info) as member:
                while block := member.read(BLOCK):
                    produced += len(block)
                    if produced > budget.bytes:
                        _too_big(limits, name)
                    _check_ratio(produced, info, limits, name=name, path=path)
                    yield block
        except NotImplementedError as exc:  # an unsupported compression method
            raise ArchiveRefused(f"{name}: {path} cannot be expanded ({exc})") from None
        except (zipfile.BadZipFile, EOFError, OSError) as exc:
            raise MalformedDocument(
                f"{name}: {path} is damaged ({exc}); check that the archive is complete"
            ) from None
        budget.bytes -= produced

    # The total budget is the only byte cap here: a member is refused by it, not by max_bytes.
    return spool(blocks(), max_bytes=limits.archive_max_total_bytes, name=f"{name}: {path}")
