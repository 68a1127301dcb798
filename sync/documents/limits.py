"""The caps and sizes of document processing, from env vars (``CONNECTOR_SYNC_DOCUMENTS_*``),
with defaults. Every refusal names the variable that lifts it."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CONNECTOR_SYNC_DOCUMENTS_"


def env_name(field: str) -> str:
    """The env var that sets ``field``, for error messages."""
    return ENV_PREFIX + field.upper()


class DocumentLimits(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    max_bytes: int = Field(
        default=1024**3, ge=1, description="Largest document accepted, in raw bytes."
    )
    max_pages: int = Field(default=10_000, ge=1, description="Most pages (PDF, or form feeds).")
    max_chunks: int = Field(default=2_000_000, ge=1, description="Most chunks one document makes.")
    chunk_chars: int = Field(
        default=1000, ge=100, le=100_000, description="Longest chunk, in characters."
    )
    chunk_overlap: int = Field(
        default=150, ge=0, description="Characters a chunk repeats from the end of the one before."
    )

    archive_max_total_bytes: int = Field(
        default=2 * 1024**3, ge=1, description="Most bytes an archive expands to, nested included."
    )
    archive_max_members: int = Field(
        default=10_000, ge=1, description="Most member files in one archive, nested included."
    )
    archive_max_ratio: int = Field(
        default=100, ge=1, description="Largest expanded/compressed ratio of one member."
    )
    archive_ratio_floor: int = Field(
        default=1024**2,
        ge=0,
        description="Members that expand to less than this are not held to the ratio.",
    )
    archive_max_depth: int = Field(
        default=1, ge=0, description="Archives inside an archive expanded, levels deep."
    )

    @model_validator(mode="after")
    def _overlap_below_half(self) -> DocumentLimits:
        # The chunker cuts in the second half of its window; an overlap under half a chunk
        # guarantees that every chunk moves forward.
        if self.chunk_overlap * 2 >= self.chunk_chars:
            raise ValueError("chunk_overlap must be less than half of chunk_chars")
        return self
