"""Ingestions: files made searchable by checkpointed jobs (see docs/documents.md)."""
