"""GitHub (REST): a repository's issues and pull requests, both ``full`` tables.

Pages follow the ``Link`` header. GitHub's rate limits are its own dialect, translated here into
the SDK's: a response with ``x-ratelimit-remaining: 0`` spends the shared budget until
``x-ratelimit-reset`` (so the next request waits, or the attempt ends and the run is requeued at
the reset); a 403 or 429 that is a rate limit (primary or secondary) is rate limited, never a
permanent error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from connectors.auth import BearerToken
from connectors.base import Connector, Table
from connectors.context import ConnectorContext
from connectors.credentials import TokenCredentials
from connectors.errors import PermanentError
from connectors.http import HttpClient
from connectors.http_policy import (
    Classification,
    Verdict,
    parse_reset_epoch,
    parse_retry_after,
)
from connectors.paging import link_header_pages

API_VERSION = "2022-11-28"
PER_PAGE = 100
# Oldest first: an item created while we page lands on the last page instead of pushing every
# item one place down (newest first), where the boundary item would be read twice.
LIST_PARAMS = {"state": "all", "per_page": PER_PAGE, "sort": "created", "direction": "asc"}
# GitHub: a secondary limit with neither retry-after nor a spent primary budget means "wait at
# least one minute before retrying".
SECONDARY_LIMIT_WAIT = 60.0

# Owner and repository names as GitHub allows them; anything else would change the URL's path.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]


class GitHubConfig(BaseModel):
    """One owner (user or organization) and one or more of its repositories."""

    model_config = ConfigDict(extra="forbid")

    owner: Name
    repos: list[Name] = Field(min_length=1)
    base_url: str = Field(
        default="https://api.github.com",
        description="https://HOST/api/v3 for GitHub Enterprise Server.",
    )


def classify_github(response: httpx.Response, now: datetime) -> Classification | None:
    """GitHub's rate-limit responses, which may be a 403 as well as a 429 (pure).

    Per GitHub's docs: ``retry-after`` wins; else a spent primary budget waits until
    ``x-ratelimit-reset``; else a secondary limit (named in the message) waits a minute. A 403
    that is none of these (no permission) is left to the standard classification: permanent.
    """
    if response.status_code not in (403, 429):
        return None
    headers = response.headers
    raw = headers.get("retry-after")
    if raw is not None:
        wait = parse_retry_after(raw, now)
        return Classification(Verdict.RATE_LIMITED, wait, nonsense_retry_after=wait is None)
    if headers.get("x-ratelimit-remaining", "").strip() == "0":
        return Classification(
            Verdict.RATE_LIMITED, parse_reset_epoch(headers.get("x-ratelimit-reset"), now)
        )
    if b"rate limit" in response.content[:2048].lower():
        return Classification(Verdict.RATE_LIMITED, SECONDARY_LIMIT_WAIT)
    return None


def spent_until(response: httpx.Response, now: datetime) -> datetime | None:
    """When the primary budget a successful response used up is free again; None if some is left
    (pure)."""
    if response.headers.get("x-ratelimit-remaining", "").strip() != "0":
        return None
    wait = parse_reset_epoch(response.headers.get("x-ratelimit-reset"), now)
    return None if wait is None else now + timedelta(seconds=wait)


class GitHubConnector(Connector):
    provider = "github"
    tables = (Table("issues"), Table("pull_requests"))
    config_model = GitHubConfig
    credentials_model = TokenCredentials

    def __init__(self, context: ConnectorContext) -> None:
        super().__init__(context)
        config = context.config
        assert isinstance(config, GitHubConfig)
        self.config = config
        self._http = HttpClient(
            context,
            base_url=config.base_url.rstrip("/"),
            auth=BearerToken(str(context.credentials.get("token") or "")),
            headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION},
            on_response=self._note_budget,
            classify_response=classify_github,
        )

    @classmethod
    def budget_key(cls, config: BaseModel, credentials: Mapping[str, Any]) -> str | None:
        # GitHub's budget belongs to the token (on one GitHub host). Only a digest of it leaves
        # here: the engine hashes the key again, but a key must never be a secret.
        assert isinstance(config, GitHubConfig)
        token = str(credentials.get("token") or "")
        if not token:
            return None
        digest = hashlib.sha256(f"{config.base_url}\n{token}".encode()).hexdigest()
        return f"token:{digest[:32]}"

    def read(self, table: Table) -> Iterator[Sequence[Mapping[str, Any]]]:
        path = {"issues": "issues", "pull_requests": "pulls"}[table.name]
        for repo in self.config.repos:
            url = f"/repos/{self.config.owner}/{repo}/{path}"
            for response in link_header_pages(self._http, url, params=LIST_PARAMS):
                page = self._http.json_of(response)
                if not isinstance(page, list):
                    raise PermanentError(
                        f"GET {url}: expected a JSON list, got {type(page).__name__}"
                    )
                if table.name == "issues":
                    # The issues endpoint lists pull requests too (with a `pull_request` key and
                    # an issue id, not the pull request's): they belong to the other table.
                    page = [item for item in page if "pull_request" not in item]
                yield page

    def close(self) -> None:
        self._http.close()

    def _note_budget(self, response: httpx.Response) -> None:
        # A 403/429 is classified (and its wait reported) by the HTTP client; this catches the
        # successful response that spent the last request, so the next one waits for the reset.
        if response.is_success:
            until = spent_until(response, datetime.now(UTC))
            if until is not None:
                self.context.report_rate_limit(
                    until, "GitHub x-ratelimit-remaining reached 0 (primary rate limit)"
                )
