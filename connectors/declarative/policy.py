"""What a declared provider's responses mean, from its ``rate_limit`` and ``retry`` sections, as
pure functions the HTTP client calls: which statuses are rate limits and how long they last
(Retry-After, else the reset header), which are retried, and when a successful response spent
the budget (its remaining count reached 0)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import httpx

from connectors.declarative.spec import RateLimit, Retry
from connectors.http_policy import Classification, Verdict, parse_reset_epoch, parse_retry_after


def classify(
    response: httpx.Response, now: datetime, rate_limit: RateLimit | None, retry: Retry | None
) -> Classification | None:
    """The verdict the provider's own rules give a response; None: the standard rules apply
    (429 and 503 with Retry-After rate limited, other 5xx retried, 401 refreshed, other 4xx
    permanent). A status in ``rate_limit.statuses``, or a 403 whose remaining count is 0, is a
    rate limit; with ``retry``, its statuses are retried and every other 5xx is permanent."""
    status = response.status_code
    if status < 400:
        return None
    if rate_limit is not None and (
        status in rate_limit.statuses or (status == 403 and _spent(response, rate_limit))
    ):
        raw = response.headers.get(rate_limit.retry_after_header)
        wait = parse_retry_after(raw, now) if raw is not None else None
        if wait is None:
            wait = reset_wait(response.headers, rate_limit, now)
        return Classification(Verdict.RATE_LIMITED, wait, raw is not None and wait is None)
    standard = status in (401, 429) or (status == 503 and "retry-after" in response.headers)
    if retry is None or standard:
        return None
    if status in retry.statuses:
        return Classification(Verdict.TRANSIENT)
    if status >= 500:
        return Classification(Verdict.PERMANENT)
    return None


def spent_until(response: httpx.Response, now: datetime, rate_limit: RateLimit) -> datetime | None:
    """When the budget a successful response used up is free again; None while some is left
    or the reset is not said."""
    if not response.is_success or not _spent(response, rate_limit):
        return None
    wait = reset_wait(response.headers, rate_limit, now)
    return None if wait is None else now + timedelta(seconds=wait)


def reset_wait(headers: Mapping[str, str], rate_limit: RateLimit, now: datetime) -> float | None:
    """Seconds until the reset header's time: a Unix time, or seconds from now."""
    if rate_limit.reset_header is None:
        return None
    raw = headers.get(rate_limit.reset_header)
    if rate_limit.reset == "epoch":
        return parse_reset_epoch(raw, now)
    return parse_retry_after(raw, now)


def _spent(response: httpx.Response, rate_limit: RateLimit) -> bool:
    name = rate_limit.remaining_header
    return name is not None and response.headers.get(name, "").strip() == "0"
