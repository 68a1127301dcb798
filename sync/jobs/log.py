"""The one log adapter of every kind of leased work: each line about an attempt names what it
is of (run, connection, job, queue, ingestion...), its attempt and the worker, as ``key=value``
tags after the message (for plain-text logs) and as record attributes (for structured
handlers)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

Logger = logging.LoggerAdapter[logging.Logger]


class JobLog(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        context = self.extra or {}
        kwargs["extra"] = {**context, **kwargs.get("extra", {})}
        tags = " ".join(f"{key.removesuffix('_id')}={value}" for key, value in context.items())
        return f"{msg} [{tags}]", kwargs


def job_log(kind: str, ids: Mapping[str, Any], worker_id: str) -> JobLog:
    """The log of one attempt of a unit of ``kind`` (its logger is ``sync.<kind>``)."""
    return JobLog(_logger(kind), {**ids, "worker_id": worker_id})


@functools.cache
def _logger(kind: str) -> logging.Logger:
    return logging.getLogger(f"sync.{kind}")
