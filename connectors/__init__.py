"""The connector SDK: what a provider plugin is made of. It never imports the engine (`sync`)."""

from connectors.auth import ApiKey, Auth, BearerToken, OAuth2
from connectors.base import Checkpoint, Connector, Deleted, Item, Mode, NoConfig, Resync, Table
from connectors.context import ConnectorContext
from connectors.credentials import (
    OAuth2ClientCredentials,
    OAuth2RefreshCredentials,
    TokenCredentials,
)
from connectors.errors import (
    Aborted,
    AuthError,
    ConnectorError,
    PermanentError,
    RateLimited,
    RetryableError,
)
from connectors.http import HttpClient
from connectors.paging import (
    cursor_pages,
    link_header_pages,
    next_link_pages,
    page_number_pages,
)
from connectors.registry import DuplicateProvider, UnknownProvider, get, providers, register

__all__ = [
    "Aborted",
    "ApiKey",
    "Auth",
    "AuthError",
    "BearerToken",
    "Checkpoint",
    "Connector",
    "ConnectorContext",
    "ConnectorError",
    "Deleted",
    "DuplicateProvider",
    "HttpClient",
    "Item",
    "Mode",
    "NoConfig",
    "OAuth2",
    "OAuth2ClientCredentials",
    "OAuth2RefreshCredentials",
    "PermanentError",
    "RateLimited",
    "Resync",
    "RetryableError",
    "Table",
    "TokenCredentials",
    "UnknownProvider",
    "cursor_pages",
    "get",
    "link_header_pages",
    "next_link_pages",
    "page_number_pages",
    "providers",
    "register",
]
