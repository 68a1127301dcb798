"""What any kind needs to make a connection's connector: the connector class of its provider,
its config validated by the connector's model, and its credentials decrypted (and registered
with the redaction, so no log line or error shows them); and the one credential refresh every
kind's connector context runs. A kind then builds the connector with a context of its own (a
run's, an ingestion's)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

import connectors
from connectors.base import Connector
from connectors.errors import PermanentError
from sync.base import redact
from sync.base.secrets import SecretBox
from sync.errors import SecretsError, describe_validation_error
from sync.jobs.budgets import budget_key_of
from sync.store import RunStore
from sync.store.db import Connection, Pool
from sync.vocabulary import ErrorKind, JobError


class ConnectorSetupError(Exception):
    """The connection cannot be used as it is: an unknown provider, a config the connector
    refuses, credentials that cannot be decrypted. ``error`` is the job's error (kind
    ``config``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error = JobError(ErrorKind.CONFIG, message)


def connector_inputs(
    provider: str,
    config: Mapping[str, Any] | None,
    credentials: bytes | None,
    secrets: SecretBox | None,
    cls: type[Connector[Any]] | None = None,
) -> tuple[type[Connector[Any]], BaseModel, dict[str, Any]]:
    """The connector class (``cls``, else the provider's registered one), validated config and
    decrypted credentials of a connection."""
    if cls is None:
        try:
            cls = connectors.get(provider)
        except connectors.UnknownProvider as exc:
            raise ConnectorSetupError(str(exc)) from None
    try:
        validated = cls.config_model.model_validate(dict(config or {}))
    except ValidationError as exc:
        raise ConnectorSetupError(describe_validation_error(exc)) from None
    decrypted: dict[str, Any] = {}
    if credentials is not None:
        if secrets is None:
            raise ConnectorSetupError("no secret key is configured")
        try:
            decrypted = secrets.decrypt(credentials)
        except SecretsError as exc:
            raise ConnectorSetupError(str(exc)) from None
        redact.register(decrypted)
    return cls, validated, decrypted


def refresh_credentials(
    pool: Pool,
    lock: Callable[[Connection], bytes | None],
    refresh: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    connection_id: int,
    connector_class: type[Connector[Any]],
    provider: str,
    config: BaseModel,
    secrets: SecretBox | None,
    logger: logging.LoggerAdapter[logging.Logger],
) -> dict[str, Any]:
    """Run ``refresh(current)`` under the connection row's lock and save what it returns,
    encrypted, with the budget it draws on, in one transaction. ``lock`` takes the lock in a
    statement fenced by the caller's own lease (a run's, an ingestion's) and raises
    :class:`~sync.errors.LeaseLost` when that lease is lost: two jobs never spend one
    single-use refresh token, and a stale one never refreshes. ``current`` is what is stored
    now (another job may have refreshed meanwhile)."""
    if secrets is None:
        raise PermanentError("no secret key is configured, so credentials cannot be saved")
    with pool.connection() as conn, conn.transaction():
        stored = lock(conn)
        current = secrets.decrypt(stored) if stored else {}
        fresh = dict(refresh(current))
        redact.register(fresh)
        if fresh != current:
            RunStore.save_credentials(
                conn,
                connection_id,
                secrets.encrypt(fresh),
                budget_key_of(connector_class, provider, config, fresh),
            )
            logger.info("credentials refreshed and saved")
    return fresh
