"""How requests are authenticated: a bearer token, a user and password (HTTP Basic), an API key (in
a header or the query string), or OAuth2 (authlib) with refresh.

OAuth2 refreshes go through ``context.refresh_credentials``: the engine runs the refresh under a
per-connection database lock and saves the new tokens, encrypted, in a fenced write, so two runs
never spend one single-use refresh token and a rotated token is never lost.

The token endpoint is a provider like any other. A 429 or 503 from it is a rate limit (its
Retry-After wins) and a 5xx or a network error is retryable: neither says anything about the
credentials. Only a refusal of the grant or of the client (``invalid_grant``,
``invalid_client``, ``unauthorized_client``, or a 401 without a code: the client's
authentication failed) means they must be given again, and disconnects the connection. An
access token the API refused (a 401) is marked unusable before the refresh, so that if the
refresh fails the next attempt refreshes first instead of sending it again.
"""

from __future__ import annotations

import base64
import time
import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from authlib.integrations.base_client.errors import OAuthError
from authlib.oauth2.rfc6749.errors import OAuth2Error

with warnings.catch_warnings():
    # Authlib 1.9 prefers the httpx2 fork and warns when it falls back to httpx. We use httpx
    # on purpose: one HTTP stack for connectors and for respx in tests.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.httpx_client import OAuth2Client

from connectors.context import ConnectorContext
from connectors.errors import AuthError, PermanentError, RateLimited, RetryableError
from connectors.http_policy import parse_retry_after

# Refresh a token this long before it expires, so it never expires mid-request.
EXPIRY_SKEW = 60.0

# OAuth 2.0 error codes (RFC 6749 section 5.2) that refuse the grant or the client: only these
# mean the credentials must be given again.
REFUSALS = frozenset({"invalid_grant", "invalid_client", "unauthorized_client"})


class Auth:
    """Adds credentials to a request; may be able to refresh them after a 401."""

    def apply(self, headers: dict[str, str]) -> None:
        raise NotImplementedError

    def query(self) -> Mapping[str, str]:
        """Query parameters that carry the credentials (an API key sent as ``?api_key=``)."""
        return {}

    def refresh(self) -> bool:
        """Get fresh credentials; False if this kind of credential cannot be refreshed."""
        return False

    def refused(self) -> None:
        """The provider refused the credentials last applied (a 401): never apply them again."""


class BearerToken(Auth):
    def __init__(self, token: str) -> None:
        if not token:
            raise AuthError("the connection's credentials have no token")
        self._token = token

    def apply(self, headers: dict[str, str]) -> None:
        headers["Authorization"] = f"Bearer {self._token}"


class BasicAuth(Auth):
    """HTTP Basic authentication (RFC 7617): a user name and a password."""

    def __init__(self, username: str, password: str) -> None:
        if not username:
            raise AuthError("the connection's credentials have no user name")
        self._value = base64.b64encode(f"{username}:{password}".encode()).decode()

    def apply(self, headers: dict[str, str]) -> None:
        headers["Authorization"] = f"Basic {self._value}"


class ApiKey(Auth):
    """An API key in a header (``X-API-Key`` by default), or, with ``param``, in the query
    string (which the HTTP client keeps out of every message and cache key)."""

    def __init__(self, key: str, header: str = "X-API-Key", *, param: str | None = None) -> None:
        if not key:
            raise AuthError("the connection's credentials have no API key")
        self._key = key
        self._header = header
        self._param = param

    def apply(self, headers: dict[str, str]) -> None:
        if self._param is None:
            headers[self._header] = self._key

    def query(self) -> Mapping[str, str]:
        return {} if self._param is None else {self._param: self._key}


Grant = Literal["client_credentials", "refresh_token"]


class OAuth2(Auth):
    """OAuth2 access tokens from ``context.credentials``: ``client_id``, ``client_secret``,
    and ``access_token`` / ``refresh_token`` / ``expires_at`` (Unix seconds) once obtained.

    ``grant="client_credentials"`` fetches a new token with the client's own credentials;
    ``grant="refresh_token"`` (the authorization-code flow) spends the refresh token, and keeps
    the new one if the provider rotates it.
    """

    def __init__(
        self,
        context: ConnectorContext,
        *,
        token_url: str,
        grant: Grant,
        scope: str | None = None,
        client_auth: Literal["client_secret_post", "client_secret_basic"] = "client_secret_post",
    ) -> None:
        self._context = context
        self._token_url = token_url
        self._grant = grant
        self._scope = scope
        self._client_auth = client_auth
        self._credentials: Mapping[str, Any] = dict(context.credentials)
        for field in ("client_id", "client_secret"):
            if not self._credentials.get(field):
                raise AuthError(f"the connection's credentials have no {field}")
        if grant == "refresh_token" and not self._credentials.get("refresh_token"):
            raise AuthError("the connection's credentials have no refresh_token; authorize again")

    def apply(self, headers: dict[str, str]) -> None:
        if not self._usable(self._credentials):
            self.refresh()
        headers["Authorization"] = f"Bearer {self._credentials['access_token']}"

    def refused(self) -> None:
        used = self._credentials.get("access_token")
        if not used:
            return

        def unusable(current: Mapping[str, Any]) -> Mapping[str, Any]:
            # Only the token that was refused: another run may have saved a fresh one.
            if current.get("access_token") != used:
                return current
            return {k: v for k, v in current.items() if k not in ("access_token", "expires_at")}

        self._credentials = dict(self._context.refresh_credentials(unusable))

    def refresh(self) -> bool:
        used = self._credentials.get("access_token")

        def renew(current: Mapping[str, Any]) -> Mapping[str, Any]:
            # Another run may have refreshed while we waited for the lock: use its token.
            if current.get("access_token") != used and self._usable(current):
                return current
            return {**current, **self._fetch(current)}

        self._credentials = dict(self._context.refresh_credentials(renew))
        return True

    @staticmethod
    def _usable(credentials: Mapping[str, Any]) -> bool:
        token = credentials.get("access_token")
        expires_at = credentials.get("expires_at")
        if not token:
            return False
        return expires_at is None or float(expires_at) - EXPIRY_SKEW > time.time()

    def _fetch(self, current: Mapping[str, Any]) -> dict[str, Any]:
        client = OAuth2Client(
            client_id=current["client_id"],
            client_secret=current["client_secret"],
            scope=self._scope,
            token_endpoint_auth_method=self._client_auth,
            timeout=30.0,
        )
        # authlib's hooks see the token endpoint's answer before it is parsed as a token.
        client.register_compliance_hook("access_token_response", check_token_response)
        client.register_compliance_hook("refresh_token_response", check_token_response)
        try:
            with client:
                if self._grant == "client_credentials":
                    token = client.fetch_token(self._token_url, grant_type="client_credentials")
                else:
                    token = client.refresh_token(
                        self._token_url, refresh_token=current["refresh_token"]
                    )
        except (OAuth2Error, OAuthError) as exc:
            # An error answer that came with a 2xx status.
            raise token_error(str(exc.error), None) from None
        except httpx.TransportError as exc:
            raise RetryableError(f"the token endpoint could not be reached ({exc})") from None
        except ValueError as exc:
            raise RetryableError(f"the token endpoint's answer is not a token ({exc})") from None
        if not token.get("access_token"):
            raise PermanentError("the token endpoint answered without an access_token")
        fresh: dict[str, Any] = {"access_token": token["access_token"]}
        if token.get("expires_at") is not None:
            fresh["expires_at"] = float(token["expires_at"])
        elif token.get("expires_in") is not None:
            fresh["expires_at"] = time.time() + float(token["expires_in"])
        if token.get("refresh_token"):
            fresh["refresh_token"] = token["refresh_token"]
        return fresh


def check_token_response(response: httpx.Response) -> httpx.Response:
    """What a token endpoint's answer that is not a token means (raises), or the response to
    parse."""
    status = response.status_code
    if 200 <= status < 300:
        return response
    if status in (429, 503):
        wait = parse_retry_after(response.headers.get("retry-after"), datetime.now(UTC))
        raise RateLimited(f"the token endpoint answered {status}: rate limited", wait)
    if status >= 500:
        raise RetryableError(f"the token endpoint failed ({status})")
    response.read()
    try:
        body = response.json()
    except ValueError:
        body = None
    code = body.get("error") if isinstance(body, dict) else None
    raise token_error(str(code) if code else None, status)


def token_error(code: str | None, status: int | None) -> Exception:
    """The connector error for a token endpoint's refusal (pure): only a refused grant or
    client disconnects (a 401 says the client's authentication failed, also without a code);
    any other error is the request's own fault, permanent for this run."""
    said = f"{code}" if status is None else f"{status} {code or 'without an error code'}"
    if code in REFUSALS or (status == 401 and not code):
        return AuthError(f"the token endpoint refused the credentials ({said}); authorize again")
    return PermanentError(f"the token endpoint refused the request ({said})")
