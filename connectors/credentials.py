"""Credentials models for the common kinds of auth, for ``Connector.credentials_model``.

The engine validates a connection's credentials against its connector's model when the
connection is created or given new credentials, so a missing or mistyped field is refused then,
with the field named, instead of failing the first sync. The credentials stored are the ones
given (a model never adds or drops a field): OAuth2 tokens the engine saves after a refresh sit
beside the fields declared here. Values are never echoed in errors.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TokenCredentials(BaseModel):
    """A bearer token or personal access token: ``{"token": "..."}``."""

    model_config = ConfigDict(extra="allow")

    token: str = Field(min_length=1, description="The API token, sent as a bearer token.")


class OAuth2ClientCredentials(BaseModel):
    """An OAuth2 client (the client-credentials grant): ``client_id`` and ``client_secret``;
    the engine adds ``access_token`` and ``expires_at`` once it has fetched a token."""

    model_config = ConfigDict(extra="allow")

    client_id: str = Field(min_length=1, description="The OAuth2 application's client id.")
    client_secret: str = Field(min_length=1, description="The application's client secret.")
    access_token: str | None = Field(default=None, description="A current access token.")
    expires_at: float | None = Field(
        default=None, description="When access_token expires, in Unix seconds."
    )


class OAuth2RefreshCredentials(OAuth2ClientCredentials):
    """An OAuth2 authorization (the authorization-code flow): the client, and the refresh
    token the authorization returned. A provider that rotates refresh tokens has the new one
    saved by the engine."""

    refresh_token: str = Field(
        min_length=1, description="The refresh token from the user's authorization."
    )
