"""GitHub (REST): the issues and pull requests of one owner's repositories, each repository a
partition of both tables (one that answers 404 fails only its own slice).

Both tables are listed completely at every sync, so an issue or pull request deleted upstream is
tombstoned by the next sync; an unchanged listing costs only 304s (below). ``issues`` also saves,
per repository, the time its read began: an operator who sets ``complete_every`` for it (trading
deletion latency for requests) gets syncs that list only what changed since (``since``,
``sort=updated``, newest first) between complete listings. ``pull_requests`` (the pulls endpoint
has no ``since``) is always listed in full. Its rows ignore the volatile fields of the
repository objects every pull request embeds (``pushed_at``, ``open_issues_count``...), so a push
or a new issue rewrites no pull request.

Complete listings are asked for with conditional requests: GitHub answers an unchanged page with
a 304, which costs no rate limit, and the stored page is reused. A read of what changed since a
time names that time in its URL and is never asked again, so its response is not kept.

GitHub lists by page number, so a listing shifts when an item is deleted while it is read: both
tables are ``shifting``, and a key missing from a complete listing is confirmed with
``GET /repos/{owner}/{repo}/issues/{number}`` (or ``pulls/{number}``) before it is tombstoned:
404 or 410 is gone, 301 moved to another repository (gone from this one), 200 still there.

Pages follow the ``Link`` header; the next link is the read position a later attempt resumes
from, and ``rel="last"`` gives an estimate of the total (pages times the page size), which the
engine replaces with the records read once the listing ends. GitHub's rate limits are its own
dialect, translated here into the SDK's: a response with ``x-ratelimit-remaining: 0`` spends the
shared budget until ``x-ratelimit-reset`` (so the next request waits, or the run waits in the
queue until the reset); a 403 or 429 that is a rate limit (primary or secondary) is rate
limited, never a permanent error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Annotated, Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from connectors.auth import BearerToken
from connectors.base import (
    Checkpoint,
    Connector,
    Item,
    Mode,
    Position,
    Resync,
    Table,
    Total,
)
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
from connectors.paging import last_page, link_header_pages, next_link

API_VERSION = "2022-11-28"
PER_PAGE = 100
# A complete listing, oldest first: an item created while we page lands on the last page
# instead of pushing every item one place down (newest first), where the boundary item would be
# read twice.
LIST_PARAMS = {"state": "all", "per_page": PER_PAGE, "sort": "created", "direction": "asc"}
# What changed since a time, newest first: an item updated while we page (or while the run
# waits for the rate limit) moves to page 1, already read, so every later item moves one place
# down and none is skipped; its change is read next time. Oldest first would move it to the end
# and every later item one place up, skipping the first item of each page still to read.
SINCE_PARAMS = {"state": "all", "per_page": PER_PAGE, "sort": "updated", "direction": "desc"}
# The next `since` is when the read began, by GitHub's clock, less this much: changes made in
# the same second as the first page are read again rather than lost.
SINCE_OVERLAP = timedelta(seconds=5)

# The repository objects a pull request embeds (as head.repo and base.repo) change with every
# push, issue and star: they are no change of the pull request.
VOLATILE_REPO_FIELDS = (
    "pushed_at",
    "updated_at",
    "open_issues_count",
    "open_issues",
    "size",
    "stargazers_count",
    "watchers_count",
    "watchers",
    "forks_count",
    "forks",
    "network_count",
    "subscribers_count",
)
PULL_REQUEST_IGNORES = tuple(
    f"{side}.repo.{field}" for side in ("head", "base") for field in VOLATILE_REPO_FIELDS
)
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


class GitHubUser(BaseModel):
    login: str
    id: int


class GitHubIssue(BaseModel):
    """The fields of an issue readers query most, with their types: the columns of the
    ``issues`` view, in this order (``user`` flattened: ``user__login``, ``user__id``...). The
    issue's other fields are columns too, typed from the data."""

    id: int
    number: int
    title: str
    state: str
    user: GitHubUser | None = None
    labels: list[dict[str, Any]] = []
    comments: int = 0
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    body: str | None = None
    html_url: str


class GitHubConnector(Connector[GitHubConfig]):
    provider = "github"
    tables = (
        Table(
            "issues",
            mode=Mode.INCREMENTAL,
            shifting=True,
            model=GitHubIssue,
            flatten=("user",),
        ),
        Table("pull_requests", shifting=True, hash_ignores=PULL_REQUEST_IGNORES),
    )
    config_model = GitHubConfig
    credentials_model = TokenCredentials

    def __init__(self, context: ConnectorContext[GitHubConfig]) -> None:
        super().__init__(context)
        config = context.config
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
    def budget_key(cls, config: GitHubConfig, credentials: Mapping[str, Any]) -> str | None:
        # GitHub's budget belongs to the token (on one GitHub host). Only a digest of it leaves
        # here: the engine hashes the key again, but a key must never be a secret.
        token = str(credentials.get("token") or "")
        if not token:
            return None
        digest = hashlib.sha256(f"{config.base_url}\n{token}".encode()).hexdigest()
        return f"token:{digest[:32]}"

    def partitions(self, table: Table) -> list[str]:
        return list(self.config.repos)

    def read_partition(self, table: Table, partition: str) -> Iterator[Item | list[Item]]:
        path = f"/repos/{self.config.owner}/{partition}/{_PATHS[table.name]}"
        resumed = self.context.position(table.name, partition)
        if resumed:
            started, url, params = resumed.get("started"), resumed["next"], None
        elif table.name == "pull_requests":
            started, url, params = None, path, LIST_PARAMS
        else:
            since = (self.context.cursor(table.name, partition) or {}).get("since")
            started, url = None, path
            if since is None:
                # No cursor: the whole repository (every sync, unless an operator's
                # complete_every says only what changed is read until the next complete pass).
                yield Resync()
                params = LIST_PARAMS
            else:
                params = {**SINCE_PARAMS, "since": since}
        # What changed since a time is asked once: its URL names the time, so an ETag kept for
        # it would never be sent again.
        since_read = "since" in (params or httpx.URL(url).params)
        for response in link_header_pages(
            self._http, url, params=params, conditional=not since_read
        ):
            if started is None:
                started = _read_began(response)
            page = self._http.json_of(response)
            if not isinstance(page, list):
                raise PermanentError(f"GET {path}: expected a JSON list, got {type(page).__name__}")
            pages = last_page(response)
            if pages is not None:
                # An upper bound (the last page may be short, and the issues listing counts
                # pull requests too): the engine makes it exact once the listing is read.
                yield Total(pages * PER_PAGE, estimate=True)
            if table.name == "issues":
                # The issues endpoint lists pull requests too (with a `pull_request` key and an
                # issue id, not the pull request's): they belong to the other table.
                page = [item for item in page if "pull_request" not in item]
            yield page
            following = next_link(response)
            if following is not None:
                yield Position({"next": following, "started": started})
        if table.mode is Mode.INCREMENTAL and started is not None:
            yield Checkpoint({"since": started}, partition=partition)

    def confirm_deleted(
        self, table: Table, partition: str | None, missing: Mapping[str, Mapping[str, Any]]
    ) -> Collection[str]:
        """Ask GitHub for each missing issue or pull request by number: 404 or 410 means
        deleted, 301 transferred to another repository, 200 still there."""
        gone = []
        for key, record in missing.items():
            number = record.get("number")
            if not isinstance(number, int):
                continue
            url = f"/repos/{self.config.owner}/{partition}/{_PATHS[table.name]}/{number}"
            response = self._http.get(url, expect=(301, 404, 410), follow_redirects=False)
            if response.status_code in (301, 404, 410):
                gone.append(key)
        return gone

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


_PATHS = {"issues": "issues", "pull_requests": "pulls"}


def _read_began(response: httpx.Response) -> str:
    """When a read began by GitHub's clock (its ``Date`` header, else ours), less the overlap,
    as the ``since`` of the next read."""
    try:
        began = parsedate_to_datetime(response.headers["date"])
    except (KeyError, TypeError, ValueError):
        began = datetime.now(UTC)
    if began.tzinfo is None:
        began = began.replace(tzinfo=UTC)
    return (began - SINCE_OVERLAP).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
