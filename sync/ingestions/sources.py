"""Where an ingestion's bytes come from, and what its file is.

- A synced file: its stored record, described by its connector (``describe_file``: name, scope,
  media type, version), its content streamed by the connector's ``download`` into a temporary
  file under the byte cap, never held in memory.
- A local file (``connector-sync ingest PATH``): read from the path on the worker's machine.
- A member of an archive: the archive's bytes, fetched as above and checked to be the bytes the
  expansion saw, then the member decompressed from them under the archive's caps.

Every source ends as a :class:`~sync.documents.SpooledFile`: a snapshot whose SHA-256 says
whether an earlier attempt worked on the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from connectors.base import Connector, Table
from connectors.errors import PermanentError
from sync.base.secrets import SecretBox
from sync.documents import DocumentLimits, SpooledFile, expand_zip, spool
from sync.ingestions.context import AbortSignal, IngestionContext
from sync.ingestions.rows import ClaimedIngestion, FileRecord
from sync.ingestions.store import IngestionStore
from sync.jobs.connectors import connector_inputs
from sync.jobs.lease import Lease

ARCHIVE_TYPES = frozenset({"application/zip", "application/x-zip-compressed"})


class SourceGone(Exception):
    """The file (or its connection, or the archive it was a member of) is no longer there."""


@dataclass(frozen=True)
class FileInfo:
    """What the ingestion's file is, as read at the start of an attempt (or again before it
    is marked ready)."""

    name: str
    scope: str | None
    media_type: str | None
    version: str | None
    record_hash: bytes | None  # a synced file's record, as it was read

    @property
    def is_archive(self) -> bool:
        declared = (self.media_type or "").split(";")[0].strip().lower()
        return declared in ARCHIVE_TYPES or self.name.lower().endswith(".zip")


def member_name(path: str) -> str:
    return PurePosixPath(path).name or path


class Source:
    """The source of one claimed ingestion (or archive expansion)."""

    def __init__(
        self,
        job: ClaimedIngestion,
        *,
        store: IngestionStore,
        secrets: SecretBox | None,
        limits: DocumentLimits,
        stopper: AbortSignal,
        max_inline_wait: float,
        logger: logging.LoggerAdapter[logging.Logger],
        lease: Lease | None,
    ) -> None:
        self.job = job
        self._store = store
        self._secrets = secrets
        self._limits = limits
        self._stopper = stopper
        self._max_inline_wait = max_inline_wait
        self._logger = logger
        self._lease = lease
        self._connector: tuple[type[Connector], Any, dict[str, Any]] | None = None
        self.context: IngestionContext | None = None

    @property
    def is_local(self) -> bool:
        return self.job.source == "local"

    # -- what the file is --------------------------------------------------------------------

    def describe(self) -> FileInfo | None:
        """The file as it is now; None for a record that is not a file (a folder). Raises
        :class:`SourceGone` for a deleted file or connection."""
        job = self.job
        member = job.member_path
        if self.is_local:
            assert job.local_path is not None
            name = member_name(member) if member else Path(job.local_path).name
            return FileInfo(name, job.scope, None, None, None)
        if job.connection_id is None or job.connection_status in (None, "deleting"):
            raise SourceGone("the file's connection was deleted")
        record = self._record()
        cls, _, _ = self._inputs()
        described = cls.describe_file(self.table(), record.data)
        if described is None:
            return None
        if member:
            return FileInfo(member_name(member), described.scope, None, None, record.content_hash)
        return FileInfo(
            described.name,
            described.scope,
            described.media_type,
            described.version,
            record.content_hash,
        )

    def _record(self) -> FileRecord:
        """The file's stored record; :class:`SourceGone` when it is tombstoned or purged."""
        job = self.job
        assert job.connection_id is not None  # checked by describe()
        assert job.table_name is not None and job.external_id is not None
        record = self._store.file_record(job.connection_id, job.table_name, job.external_id)
        if record is None or record.deleted_at is not None:
            raise SourceGone("the file was deleted upstream")
        return record

    def _inputs(self) -> tuple[type[Connector], Any, dict[str, Any]]:
        if self._connector is None:
            job = self.job
            assert job.provider is not None  # a synced file's connection
            self._connector = connector_inputs(
                job.provider, job.config, job.credentials, self._secrets
            )
        return self._connector

    def table(self) -> Table:
        cls, _, _ = self._inputs()
        for table in cls.tables:
            if table.name == self.job.table_name and table.files:
                return table
        raise PermanentError(
            f"provider {self.job.provider} has no files table {self.job.table_name!r} any more"
        )

    # -- its bytes ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def bytes_of_file(self) -> Iterator[SpooledFile]:
        """The file's own bytes (an archive's, for a member), spooled to a temporary file that
        is deleted on exit."""
        spooled = self._download() if not self.is_local else self._read_local()
        try:
            yield spooled
        finally:
            spooled.close()

    @contextlib.contextmanager
    def bytes_to_index(self) -> Iterator[SpooledFile]:
        """The bytes this ingestion indexes: the file's, or its member's, decompressed from the
        archive whose bytes the expansion saw."""
        member = self.job.member_path
        with self.bytes_of_file() as spooled:
            if not member:
                yield spooled
                return
            if spooled.sha256 != self.job.archive_sha256:
                raise SourceGone(
                    "the archive changed after it was expanded; its new version is expanded "
                    "again when it is synced"
                )
            name = self.job.name or member
            with contextlib.closing(expand_zip(spooled.path, self._limits, name=name)) as found:
                for item in found:
                    self._stopper.check()
                    if item.path == member:
                        yield item.content
                        return
            raise SourceGone(f"the archive no longer holds {member}")

    def _read_local(self) -> SpooledFile:
        assert self.job.local_path is not None
        path = Path(self.job.local_path)
        try:
            with path.open("rb") as stream:
                return spool(stream, max_bytes=self._limits.max_bytes, name=path.name)
        except OSError as exc:
            raise PermanentError(
                f"{path} cannot be read on this worker's machine ({socket.gethostname()}): "
                f"{exc.strerror or exc}; ingest a local file where a worker can read it"
            ) from None

    def _download(self) -> SpooledFile:
        job = self.job
        assert job.connection_id is not None and job.provider is not None
        cls, config, credentials = self._inputs()
        context = IngestionContext(
            lease=self._lease,
            connection_id=job.connection_id,
            provider=job.provider,
            budget_key=job.budget_key,
            connector_class=cls,
            config=config,
            credentials=credentials,
            stopper=self._stopper,
            pool=self._store.pool,
            secrets=self._secrets,
            max_inline_wait=self._max_inline_wait,
            logger=self._logger,
        )
        self.context = context
        record = self._record()
        connector = cls(context)
        fd, raw = tempfile.mkstemp(prefix="connector-sync-", suffix=".download")
        path = Path(raw)
        try:
            with os.fdopen(fd, "w+b") as out:
                got = connector.download(
                    self.table(), record.data, out, max_bytes=self._limits.max_bytes
                )
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            connector.close()
        if not got.sha256:  # a connector that did not hash what it wrote
            digest = hashlib.sha256()
            with path.open("rb") as written:
                while block := written.read(1024 * 1024):
                    digest.update(block)
            return SpooledFile(path, got.size, digest.hexdigest())
        return SpooledFile(path, got.size, got.sha256)
