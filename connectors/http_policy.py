"""What a provider's HTTP response means, as pure functions: Retry-After parsing, response
classification, and whether credentials may follow a redirect. The HTTP client
(``connectors.http``) applies the verdicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

import httpx

# A Retry-After beyond this is not a wait, it is a bug or an attack: fall back to the backoff.
MAX_RETRY_AFTER = 24 * 3600.0


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds or an HTTP date (RFC 9110).

    None when absent or nonsense (negative, beyond a day, unparseable). A date in the past means
    "now" (0 s).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = max((when - now).total_seconds(), 0.0)
    if not (0 <= seconds <= MAX_RETRY_AFTER):  # also rejects NaN
        return None
    return seconds


def parse_reset_epoch(value: str | None, now: datetime) -> float | None:
    """Seconds until a rate-limit reset given as a Unix timestamp (GitHub's
    ``x-ratelimit-reset``, Procore's ``X-Rate-Limit-Reset``); None if absent or nonsense."""
    if value is None:
        return None
    try:
        epoch = float(value.strip())
    except ValueError:
        return None
    seconds = epoch - now.timestamp()
    if seconds != seconds or seconds > MAX_RETRY_AFTER:
        return None
    return max(seconds, 0.0)


class Verdict(StrEnum):
    OK = "ok"
    TRANSIENT = "transient"  # retry in-request, shortly
    RATE_LIMITED = "rate_limited"  # wait (Retry-After, else backoff) and try again
    RETRYABLE = "retryable"  # give up this attempt; the run is retried later
    REFRESH = "refresh"  # refresh the credentials once and repeat the request
    AUTH = "auth"  # credentials refused even after a refresh
    PERMANENT = "permanent"  # retrying cannot help


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    wait: float | None = None  # seconds, for RATE_LIMITED; None: use the backoff
    nonsense_retry_after: bool = False  # a Retry-After was sent but could not be used


def classify(
    status: int, headers: Mapping[str, str], now: datetime, *, refreshed: bool
) -> Classification:
    """The verdict on one response. ``refreshed``: the credentials were already refreshed for
    this request, so a second 401 is final."""
    if 200 <= status < 300:
        return Classification(Verdict.OK)
    raw = headers.get("retry-after")
    if status == 429 or (status == 503 and raw is not None):
        wait = parse_retry_after(raw, now)
        return Classification(Verdict.RATE_LIMITED, wait, raw is not None and wait is None)
    if status in (502, 503, 504):
        return Classification(Verdict.TRANSIENT)
    if status >= 500:
        return Classification(Verdict.RETRYABLE)
    if status == 401:
        return Classification(Verdict.AUTH if refreshed else Verdict.REFRESH)
    return Classification(Verdict.PERMANENT)


def _port(url: httpx.URL) -> int | None:
    return url.port if url.port is not None else {"http": 80, "https": 443}.get(url.scheme)


def credentials_may_follow(origin: httpx.URL, target: httpx.URL) -> bool:
    """Whether a redirect from a request to ``origin`` may carry its credentials to ``target``:
    only to the same origin (scheme, host and port), or to the same host upgraded from http to
    https on the default ports, as browsers and httpx allow."""
    if origin.host != target.host:
        return False
    if origin.scheme == target.scheme:
        return _port(origin) == _port(target)
    upgrade = (origin.scheme, _port(origin), target.scheme, _port(target))
    return upgrade == ("http", 80, "https", 443)
