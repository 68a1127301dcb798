"""Document processing: the building blocks of indexing files for search.

A document's bytes are spooled to a temporary file (:func:`spool`), its text extracted page by
page (:class:`Extraction`), cut into a deterministic sequence of chunks (:func:`chunks`),
embedded (:class:`HashingEmbedder` by default, :class:`OpenAIEmbeddings` for an endpoint) and
stored and searched in Postgres (:class:`DocumentStore`). Archives are expanded safely by
:func:`expand_zip`. Nothing here depends on the job machinery; a job drives these functions and
fences their writes. See docs/documents.md.
"""

from sync.documents.archive import ArchiveMember, expand_zip
from sync.documents.chunking import Chunk, chunks
from sync.documents.embeddings import Embedder, HashingEmbedder
from sync.documents.errors import (
    ArchiveRefused,
    DocumentError,
    DocumentTooLarge,
    MalformedDocument,
    UnsupportedDocument,
)
from sync.documents.extract import Extraction, MediaType, Segment, indexable, media_type_of
from sync.documents.limits import DocumentLimits
from sync.documents.openai_embeddings import OpenAIEmbeddings
from sync.documents.spool import SpooledFile, spool
from sync.documents.store import DocumentStore, SearchHit, VectorStorage

__all__ = [
    "ArchiveMember",
    "ArchiveRefused",
    "Chunk",
    "DocumentError",
    "DocumentLimits",
    "DocumentStore",
    "DocumentTooLarge",
    "Embedder",
    "Extraction",
    "HashingEmbedder",
    "MalformedDocument",
    "MediaType",
    "OpenAIEmbeddings",
    "SearchHit",
    "Segment",
    "SpooledFile",
    "UnsupportedDocument",
    "VectorStorage",
    "chunks",
    "expand_zip",
    "indexable",
    "media_type_of",
    "spool",
]
