"""What any job needs before it can make a connection's connector: the connector class of its
provider, its config validated by the connector's model, and its credentials decrypted (and
registered with the redaction, so no log line or error shows them). A job then builds the
connector with a context of its own kind (a run's, an ingestion's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

import connectors
from connectors.base import Connector
from sync.base import redact
from sync.base.secrets import SecretBox
from sync.errors import SecretsError, describe_validation_error
from sync.vocabulary import ErrorKind, RunError


class ConnectorSetupError(Exception):
    """The connection cannot be used as it is: an unknown provider, a config the connector
    refuses, credentials that cannot be decrypted. ``error`` is the job's error (kind
    ``config``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error = RunError(ErrorKind.CONFIG, message)


def connector_inputs(
    provider: str,
    config: Mapping[str, Any] | None,
    credentials: bytes | None,
    secrets: SecretBox | None,
) -> tuple[type[Connector[Any]], BaseModel, dict[str, Any]]:
    """The connector class, validated config and decrypted credentials of a connection."""
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
