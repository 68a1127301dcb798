"""The errors a connector raises to tell the engine what went wrong and what to do about it.

The engine decides from the type alone: retry the attempt later, wait for the provider's
budget, give the table up, or mark the connection disconnected.
"""

from __future__ import annotations


class ConnectorError(Exception):
    """Base of every error a connector raises on purpose."""

    kind = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RetryableError(ConnectorError):
    """A transient fault (5xx, reset connection): the attempt is retried with backoff."""

    kind = "retryable"


class RateLimited(RetryableError):
    """The provider asked us to slow down. ``retry_after`` (seconds) wins over the backoff."""

    kind = "rate_limited"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ConnectorError):
    """Retrying cannot help (a 4xx, a malformed record, a bad config): the table fails."""

    kind = "permanent"


class ContentTooLarge(PermanentError):
    """A download went past the byte limit its caller set: the file is refused, and what was
    written of it is discarded."""

    kind = "too_large"

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class NotFound(PermanentError):
    """The provider answered 404 or 410: what was asked for is not there (deleted, or out of
    the credentials' reach). A partition whose listing answers this at two syncs in a row is
    gone, and its rows are tombstoned."""

    kind = "gone"


class FileGone(NotFound):
    """The file was deleted (or moved out of reach) upstream since it was listed: there is
    nothing to fetch, and the next sync tombstones its row."""


class AuthError(PermanentError):
    """Credentials were refused and refreshing them did not help: the connection is
    marked ``disconnected`` until someone gives it new credentials."""

    kind = "auth"


class Aborted(Exception):
    """Raised inside connector code when the engine has aborted the run (cancel, lost lease,
    timeout or shutdown). Connectors let it propagate."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the run was aborted: {reason}")
        self.reason = reason
