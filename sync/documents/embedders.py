"""The embedder the settings choose, built in this one place for everything that makes vectors:
the workers' ingestions (chunks) and search (queries). ``CONNECTOR_SYNC_EMBEDDER`` is
``hashing`` (the default, no network) or ``openai`` (an OpenAI-compatible endpoint, with the
``CONNECTOR_SYNC_EMBEDDINGS_*`` settings). A chunk records the model that embedded it, and a
search compares a query's vector only with chunks of the same model, so every process of a
deployment must be given the same settings."""

from __future__ import annotations

from connectors.context import RequestContext
from sync.base.settings import Settings
from sync.documents.embeddings import Embedder, HashingEmbedder
from sync.documents.openai_embeddings import OpenAIEmbeddings, StandaloneContext


def embedder_from(settings: Settings, context: RequestContext | None = None) -> Embedder:
    """The configured embedder. ``context`` serves the endpoint's requests (its abort signal,
    its sleeps); without one they sleep for real, up to ``max_inline_wait``, and never abort."""
    if settings.embedder == "hashing":
        return HashingEmbedder(settings.embeddings_dimensions or 256)
    # The settings' validation has made sure that these are set (Settings._endpoint_is_complete).
    assert settings.embeddings_url and settings.embeddings_model
    assert settings.embeddings_dimensions
    key = settings.embeddings_api_key
    return OpenAIEmbeddings(
        base_url=settings.embeddings_url,
        model=settings.embeddings_model,
        dimensions=settings.embeddings_dimensions,
        api_key=key.get_secret_value() if key is not None else None,
        send_dimensions=settings.embeddings_send_dimensions,
        context=context or StandaloneContext(settings.max_inline_wait),
    )


def close_embedder(embedder: Embedder) -> None:
    """Release what an embedder holds (an endpoint's connections); nothing for the others."""
    close = getattr(embedder, "close", None)
    if callable(close):
        close()
