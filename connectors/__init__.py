"""The connector SDK: what a provider plugin is made of. It never imports the engine (`sync`)."""

from connectors.auth import ApiKey, Auth, BasicAuth, BearerToken, OAuth2
from connectors.base import (
    Checkpoint,
    Connector,
    Deleted,
    Deletions,
    Item,
    Mode,
    NoConfig,
    Position,
    Resync,
    Table,
    Total,
)
from connectors.context import ConnectorContext, RequestContext
from connectors.credentials import (
    OAuth2ClientCredentials,
    OAuth2RefreshCredentials,
    TokenCredentials,
)
from connectors.errors import (
    Aborted,
    AuthError,
    ConnectorError,
    ContentTooLarge,
    FileGone,
    NotFound,
    PermanentError,
    RateLimited,
    RetryableError,
)
from connectors.files import Download, File
from connectors.http import HttpClient
from connectors.paging import (
    cursor_pages,
    last_page,
    link_header_pages,
    next_link,
    next_link_pages,
    offset_pages,
    page_number_pages,
)
from connectors.registry import DuplicateProvider, UnknownProvider, get, providers, register

__all__ = [
    "Aborted",
    "ApiKey",
    "Auth",
    "AuthError",
    "BasicAuth",
    "BearerToken",
    "Checkpoint",
    "Connector",
    "ConnectorContext",
    "ConnectorError",
    "ContentTooLarge",
    "Deleted",
    "Deletions",
    "Download",
    "DuplicateProvider",
    "File",
    "FileGone",
    "HttpClient",
    "Item",
    "Mode",
    "NoConfig",
    "NotFound",
    "OAuth2",
    "OAuth2ClientCredentials",
    "OAuth2RefreshCredentials",
    "PermanentError",
    "Position",
    "RateLimited",
    "RequestContext",
    "Resync",
    "RetryableError",
    "Table",
    "TokenCredentials",
    "Total",
    "UnknownProvider",
    "cursor_pages",
    "get",
    "last_page",
    "link_header_pages",
    "next_link",
    "next_link_pages",
    "offset_pages",
    "page_number_pages",
    "providers",
    "register",
]
