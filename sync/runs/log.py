"""The run log: every line about a run names its run, connection, attempt and worker."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("sync.run")

Logger = logging.LoggerAdapter[logging.Logger]


class RunLog(logging.LoggerAdapter[logging.Logger]):
    """Every line about a run says which run, connection, attempt and worker, in the message
    (for plain-text logs) and as record attributes (for structured handlers)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        context = self.extra or {}
        kwargs["extra"] = {**context, **kwargs.get("extra", {})}
        tags = " ".join(f"{key.removesuffix('_id')}={value}" for key, value in context.items())
        return f"{msg} [{tags}]", kwargs


def run_log(run_id: int, connection_id: int | None, attempt: int, worker_id: str) -> RunLog:
    return RunLog(
        log,
        {
            "run_id": run_id,
            "connection_id": connection_id,
            "attempt": attempt,
            "worker_id": worker_id,
        },
    )
