"""A handler's failure as the one line a job keeps: the exception's type and message, with any
registered secret redacted, at most 500 characters."""

from __future__ import annotations

from sync.base.redact import redact

MAX_ERROR = 500


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    line = " ".join(redact(text).split())
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 1] + "…"
