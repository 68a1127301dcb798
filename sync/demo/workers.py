"""The demo's two ``connector-sync worker`` processes, started with the demo's settings (its
database, schema, home and tuning) in their environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sync.base.settings import Settings


def _worker_env(settings: Settings, url: str, tuning: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    if settings.database_url:
        env["DATABASE_URL"] = url
    else:  # the same embedded Postgres, found through the home directory
        env.pop("DATABASE_URL", None)
    env["CONNECTOR_SYNC_SCHEMA"] = settings.schema_name
    env["CONNECTOR_SYNC_HOME"] = str(settings.home.expanduser().resolve())
    for name, value in tuning.items():
        text = f"[{', '.join(str(v) for v in value)}]" if isinstance(value, tuple) else str(value)
        env[f"CONNECTOR_SYNC_{name.upper()}"] = text
    return env


class Workers:
    """Two ``connector-sync worker`` processes, stopped with SIGTERM at the end."""

    def __init__(
        self, settings: Settings, url: str, tag: str, log_dir: Path, tuning: dict[str, Any]
    ) -> None:
        self.ids = [f"demo-{tag}-w{n}" for n in (1, 2)]
        self.logs = [log_dir / f"{wid}.log" for wid in self.ids]
        self._procs: list[subprocess.Popen[bytes]] = []
        env = _worker_env(settings, url, tuning)
        log_dir.mkdir(parents=True, exist_ok=True)
        for wid, log in zip(self.ids, self.logs, strict=True):
            with open(log, "wb") as handle:
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "sync.cli", "worker", "--id", wid],
                        env=env,
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )

    def dead(self) -> list[str]:
        return [wid for wid, p in zip(self.ids, self._procs, strict=True) if p.poll() is not None]

    def stop(self, timeout: float = 15.0) -> list[int | None]:
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self._procs:
            try:
                codes.append(proc.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes
