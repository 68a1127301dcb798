"""Keeps secrets out of logs, errors and results. Every credential value the engine decrypts is
registered here; log records (see ``install``) and ``redact()`` replace any registered value
with ``[redacted]`` wherever it appears, including in formatted tracebacks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

MIN_SECRET_LENGTH = 6  # shorter values (ports, flags) would redact innocent text
REDACTED = "[redacted]"

_secrets: set[str] = set()
_lock = threading.Lock()


def register(credentials: Mapping[str, Any] | Any) -> None:
    """Remember every string value in ``credentials`` (nested too) as a secret."""
    found: list[str] = []
    _collect(credentials, found)
    with _lock:
        _secrets.update(found)


def _collect(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        if len(value) >= MIN_SECRET_LENGTH:
            out.append(value)
    elif isinstance(value, Mapping):
        for inner in value.values():
            _collect(inner, out)
    elif isinstance(value, list | tuple):
        for inner in value:
            _collect(inner, out)


def redact(text: str) -> str:
    if not _secrets:
        return text
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_json(value: Any) -> Any:
    """``redact`` applied to every string inside a JSON-shaped value."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    return value


_installed = False


def install() -> None:
    """Redact every log record at creation, whichever logger or handler it goes to: the
    message, its arguments and any traceback text."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _secrets:
            record.msg, record.args = redact(record.getMessage()), None
            if record.exc_info and record.exc_info[0] is not None:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
