"""The ingestions part of the Python API, mixed into ``sync.api.Engine``: index a local file,
follow and cancel ingestions, and search a workspace's documents. Like the rest of the API, an
engine scoped to a workspace sees and changes only that workspace's ingestions."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from connectors.errors import ConnectorError
from sync.base import redact
from sync.base.settings import Settings
from sync.documents import DocumentLimits, DocumentStore
from sync.documents.embedders import close_embedder, embedder_from
from sync.errors import Conflict, EndpointFailed, InvalidInput, NotFound
from sync.ingestions.job import indexed_with, model_of
from sync.ingestions.local_files import local_files
from sync.ingestions.models import (
    IngestedPaths,
    Ingestion,
    IngestionStatus,
    OtherModel,
    SearchResults,
)
from sync.ingestions.store import IngestionStore
from sync.store.db import Pool

MAX_LIMIT = 1000


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


class IngestionsApi:
    pool: Pool
    settings: Settings
    _workspace_id: int | None
    _ingestions: IngestionStore

    def ingest(self, path: str | Path, workspace_id: int) -> Ingestion:
        """Queue the ingestion of a local file into a workspace (or return the one already
        queued or running for that path). A worker indexes it as it indexes a synced file; it
        reads the path on its own machine, so run one where the file is."""
        self._check_workspace(workspace_id)
        file = Path(path).expanduser().resolve()
        if not file.is_file():
            raise InvalidInput(f"{path} is not a file; give the path of a file to index")
        try:
            sha256 = file_sha256(file)
        except OSError as exc:
            raise InvalidInput(f"{path} cannot be read ({exc.strerror or exc})") from None
        queued = self._ingestions.queue_local(
            workspace_id=workspace_id,
            path=str(file),
            name=file.name,
            scope=f"local:{file.parent}",
            sha256=sha256,
            max_attempts=self.settings.max_attempts,
        )
        if queued is None:
            raise NotFound(f"no workspace {workspace_id} (or it was deleted)")
        return queued

    def ingest_paths(self, paths: Sequence[str | Path], workspace_id: int) -> IngestedPaths:
        """Queue the ingestion of each file of ``paths`` into a workspace, as :meth:`ingest`
        does: a file as given, and the files of a folder (of its subfolders too), leaving out
        hidden ones and, in folders, those of a type that cannot be indexed (``skipped``). A
        path that is neither a file nor a folder is refused before anything is queued."""
        self._check_workspace(workspace_id)
        found = local_files(paths)
        queued = tuple(self.ingest(path, workspace_id) for path in found.files)
        return IngestedPaths(queued, found.skipped)

    def ingestion(self, ingestion_id: int) -> Ingestion:
        found = self._ingestions.get(ingestion_id, self._workspace_id)
        if found is None:
            raise NotFound(
                f"no ingestion {ingestion_id}; list them with `connector-sync ingestions list`"
            )
        return found

    def ingestions(
        self,
        *,
        workspace_id: int | None = None,
        status: IngestionStatus | str | None = None,
        archive_id: int | None = None,
        limit: int = 50,
    ) -> list[Ingestion]:
        """Recent ingestions, newest first; ``archive_id``: the members of that archive."""
        if status is not None:
            try:
                status = IngestionStatus(status)
            except ValueError:
                allowed = ", ".join(s.value for s in IngestionStatus)
                raise InvalidInput(f"status must be one of {allowed}") from None
        return self._ingestions.listing(
            workspace_id=self._scope_of(workspace_id),
            status=status,
            archive_id=archive_id,
            limit=max(1, min(limit, MAX_LIMIT)),
        )

    def cancel_ingestion(self, ingestion_id: int) -> Ingestion:
        """Cancel a queued ingestion at once, or ask a running one to stop: its worker ends it
        before it writes another batch."""
        cancelled = self._ingestions.cancel(ingestion_id, self._workspace_id)
        if cancelled is None:
            current = self.ingestion(ingestion_id)  # raises NotFound
            raise Conflict(
                f"ingestion {ingestion_id} has already ended ({current.status}); only a queued "
                "or running ingestion can be cancelled"
            )
        return cancelled

    def search(
        self, query: str, workspace_id: int | None = None, *, limit: int = 10
    ) -> SearchResults:
        """The ``limit`` chunks of the workspace's ready documents that best match ``query``,
        best first: full-text rank and vector similarity combined. Each hit names its file and
        page. The query is embedded by the configured embedder (``CONNECTOR_SYNC_EMBEDDER``),
        whose vectors are compared with its own model's chunks only: documents embedded by
        another model are matched by their words only, and the results say so
        (``SearchResults.notice``)."""
        workspace = self._scope_of(workspace_id)
        if workspace is None:
            raise InvalidInput("say which workspace to search")
        if not query.strip():
            raise InvalidInput("the query is empty; give a few words to search for")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}")
        embedder = embedder_from(self.settings)
        try:
            with self.pool.connection() as conn:
                hits = DocumentStore(conn).search(workspace, query, embedder, limit=limit)
            counted = self._ingestions.documents_by_settings(workspace)
        except ConnectorError as exc:
            raise EndpointFailed(
                f"the query could not be embedded: {redact.redact(exc.message)}"
            ) from None
        finally:
            close_embedder(embedder)
        others: dict[str, list[int]] = {}
        for row in counted:
            model = model_of(row.indexed_with)
            if model != embedder.model:
                total = others.setdefault(model, [0, 0])
                total[0] += row.documents
                total[1] += row.chunks
        return SearchResults(
            hits=tuple(hits),
            workspace_id=workspace,
            model=embedder.model,
            words_only=tuple(OtherModel(m, d, c) for m, (d, c) in others.items()),
        )

    def reindex(self, workspace_id: int | None = None) -> int:
        """Queue an ingestion of every file of the workspace whose document was indexed with
        another embedding model or other chunk settings than this engine's settings give (after
        the embedder was changed); returns how many were queued. Each document leaves search
        while it is indexed again, and comes back embedded by the configured model."""
        workspace = self._scope_of(workspace_id)
        if workspace is None:
            raise InvalidInput("say which workspace to index again")
        embedder = embedder_from(self.settings)
        close_embedder(embedder)
        fingerprint = indexed_with(embedder, DocumentLimits())
        return self._ingestions.queue_reindex(workspace, fingerprint, self.settings.max_attempts)

    def _scope_of(self, workspace_id: int | None) -> int | None:
        if self._workspace_id is None:
            return workspace_id
        if workspace_id not in (None, self._workspace_id):
            raise NotFound(f"no workspace {workspace_id}")
        return self._workspace_id

    def _check_workspace(self, workspace_id: int) -> None:
        if self._workspace_id is not None and workspace_id != self._workspace_id:
            raise NotFound(f"no workspace {workspace_id}")
