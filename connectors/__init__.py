"""The connector SDK: what a provider plugin is made of. It never imports the engine (`sync`)."""

from connectors.base import Checkpoint, Connector, Deleted, Item, Mode, NoConfig, Table
from connectors.context import ConnectorContext
from connectors.errors import (
    Aborted,
    AuthError,
    ConnectorError,
    PermanentError,
    RateLimited,
    RetryableError,
)
from connectors.registry import DuplicateProvider, UnknownProvider, get, providers, register

__all__ = [
    "Aborted",
    "AuthError",
    "Checkpoint",
    "Connector",
    "ConnectorContext",
    "ConnectorError",
    "Deleted",
    "DuplicateProvider",
    "Item",
    "Mode",
    "NoConfig",
    "PermanentError",
    "RateLimited",
    "RetryableError",
    "Table",
    "UnknownProvider",
    "get",
    "providers",
    "register",
]
