"""Why a document or an archive was refused. Each message is one line that says what is wrong
and what to do; retrying the same input cannot help, so a job fails such a file for good."""

from __future__ import annotations

from sync.errors import SyncError


class DocumentError(SyncError):
    """A document cannot be indexed as it is."""


class DocumentTooLarge(DocumentError):
    """Over a cap on raw bytes, pages or chunks."""


class UnsupportedDocument(DocumentError):
    """A media type we have no extractor for."""


class MalformedDocument(DocumentError):
    """The bytes are not what the media type says (a truncated PDF, an encrypted one)."""


class ArchiveRefused(DocumentError):
    """An archive that is unsafe to expand: a zip bomb, a path that escapes, a symlink, an
    encrypted member, or nesting deeper than allowed."""
