"""The command line run two ways against two databases.

``cli(*args)`` runs ``sync.cli.main`` in this process (the same code the ``connector-sync``
script runs, without an interpreter start per call) with the backend's environment, and returns
its exit code, stdout and stderr. ``script(*args)`` runs the installed script as a subprocess,
for what needs a process of its own (workers, signals).

The ``backend`` fixture is parametrized: ``database_url`` (the test database, a schema of the
test's own) and ``embedded`` (the embedded Postgres under a home directory shared by the tests
of one pytest process, stopped when they end; a schema of the test's own in it too).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sync import Engine, Settings
from sync.base.embedded import embedded_url, stop_server
from sync.cli import main
from tests.conftest import DATABASE_URL

SCRIPT = Path(sys.executable).parent / "connector-sync"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def ok(self) -> Result:
        assert self.code == 0, self.out + self.err
        assert "Traceback" not in self.err
        return self

    def json(self) -> Any:
        return json.loads(self.ok().out)

    def one_line_error(self, *needles: str, code: int = 2) -> str:
        """Exit ``code``, nothing on stdout, exactly one line on stderr with every needle."""
        assert self.code == code, (self.code, self.out, self.err)
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("error: "), lines[0]
        for needle in needles:
            assert needle in lines[0], lines[0]
        assert self.out == ""
        return lines[0]


@dataclass(frozen=True)
class Backend:
    name: str
    env: dict[str, str | None]  # None: unset
    schema: str
    home: Path | None

    def engine(self) -> Engine:
        """An Engine on the same database and schema as the CLI (migrated)."""
        settings = Settings(database_url=DATABASE_URL, schema_name=self.schema)
        url = DATABASE_URL if self.home is None else embedded_url(self.home)
        engine = Engine(settings, database_url=url)
        engine.migrate()
        return engine

    def environ(self, **extra: str | None) -> dict[str, str]:
        merged = {**os.environ, **self.env, **extra}
        return {k: v for k, v in merged.items() if v is not None}


class Cli:
    def __init__(
        self, backend: Backend, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch
    ) -> None:
        self.backend = backend
        self._capsys = capsys
        self._mp = mp

    def __call__(
        self, *args: str, stdin: str | None = None, columns: int = 200, **env: str | None
    ) -> Result:
        with self._mp.context() as m:
            for key, value in {**self.backend.env, "COLUMNS": str(columns), **env}.items():
                if value is None:
                    m.delenv(key, raising=False)
                else:
                    m.setenv(key, value)
            if stdin is not None:
                m.setattr(sys, "stdin", io.StringIO(stdin))
            self._capsys.readouterr()
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            out, err = self._capsys.readouterr()
        return Result(code, out, err)

    def worker(self, *args: str, **env: str | None) -> WorkerProcess:
        """``connector-sync worker ARGS`` in a process of its own, started (it has logged that
        it started) when this returns."""
        return WorkerProcess(self.script("worker", *args, **env))

    def script(self, *args: str, **env: str | None) -> subprocess.Popen[str]:
        """The installed script in a process of its own, stdout and stderr piped."""
        return subprocess.Popen(
            [str(SCRIPT), *args],
            env=self.backend.environ(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )


class WorkerProcess:
    """A worker process whose log (stderr, or stdout when stderr goes there) is read by a
    thread, so the pipe never fills and a test can wait for a line it logs."""

    def __init__(self, proc: subprocess.Popen[str], *, started: bool = True) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if started:
            assert self.wait_for("started", timeout=300), self.log

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def _read(self) -> None:
        # Its stderr, or its stdout when stderr goes there.
        stream = self.proc.stderr or self.proc.stdout
        assert stream is not None
        for line in stream:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self.lines.append("")  # end of output
            self._seen.notify_all()

    def wait_for(self, needle: str, timeout: float = 60) -> bool:
        """Wait until a line with ``needle`` is logged; False if the process ended first."""
        with self._seen:
            return bool(
                self._seen.wait_for(
                    lambda: (
                        any(needle in line for line in self.lines)
                        or (bool(self.lines) and self.lines[-1] == "")
                    ),
                    timeout,
                )
            ) and any(needle in line for line in self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return code


@pytest.fixture(scope="session")
def embedded_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("embedded") / "home"
    yield home
    stop_server(home)


@pytest.fixture(params=["database_url", pytest.param("embedded", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest, schema: str) -> Backend:
    if request.param == "database_url":
        env: dict[str, str | None] = {"DATABASE_URL": DATABASE_URL, "CONNECTOR_SYNC_SCHEMA": schema}
        chosen = Backend("database_url", env, schema, None)
        chosen.engine().close()  # migrated, as an operator would before anything else
        return chosen
    home: Path = request.getfixturevalue("embedded_home")
    env = {
        "DATABASE_URL": None,
        "CONNECTOR_SYNC_HOME": str(home),
        "CONNECTOR_SYNC_SCHEMA": schema,
    }
    return Backend("embedded", env, schema, home)


@pytest.fixture
def cli(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    return Cli(backend, capsys, monkeypatch)
