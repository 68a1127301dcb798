"""Connectors for tests. `memory` and `memory_events` read datasets that tests put in DATASETS
(same process only); `filedata` reads a JSON file named in its config, so worker subprocesses
see what the test writes, and can stop its process at a known row; `sleepy` reads nothing and
sleeps, for the concurrency stress (its runs must last long enough to overlap if the limiter let
them)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from connectors import (
    Checkpoint,
    Connector,
    Deleted,
    Deletions,
    Mode,
    Position,
    Table,
    Total,
    register,
)


@dataclass
class Dataset:
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # table -> (rows to yield first, exception to raise then)
    failures: dict[str, tuple[int, BaseException]] = field(default_factory=dict)
    # table -> called before each row with the row's index (to pause, signal, break things)
    before_row: dict[str, Callable[[int], None]] = field(default_factory=dict)
    deletions: dict[str, list[str]] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    # table -> seconds of a rate-limit wait slept before its first row, as the HTTP client does
    rate_limit_sleeps: dict[str, float] = field(default_factory=dict)


DATASETS: dict[str, Dataset] = {}
_lock = threading.Lock()


class MemoryConfig(BaseModel):
    dataset: str
    page_size: int = 100


@register
class MemoryConnector(Connector[MemoryConfig]):
    provider = "memory"
    tables = (Table("items", "id", Mode.FULL), Table("notes", ("owner", "n"), Mode.FULL))
    config_model = MemoryConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        dataset = DATASETS[config.dataset]
        with _lock:
            dataset.reads.append(table.name)
        rows = list(dataset.tables.get(table.name, []))
        failure = dataset.failures.get(table.name)
        hook = dataset.before_row.get(table.name)
        wait = dataset.rate_limit_sleeps.get(table.name)
        if wait is not None:
            self.context.sleep(wait)
            self.context.rate_limit_slept(wait)
        page: list[Any] = []
        for index, row in enumerate(rows):
            if failure is not None and index == failure[0]:
                raise failure[1]
            if hook is not None:
                hook(index)
            page.append(row)
            if len(page) >= config.page_size:
                yield page
                page = []
        if page:
            yield page
        if failure is not None and failure[0] >= len(rows):
            raise failure[1]


@register
class MemoryEventsConnector(Connector[MemoryConfig]):
    """An incremental table read from a feed: rows carry a `seq`; the cursor is the highest seq
    written."""

    provider = "memory_events"
    tables = (Table("events", "id", Mode.INCREMENTAL, deletions=Deletions.FEED),)
    config_model = MemoryConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        dataset = DATASETS[config.dataset]
        since = (self.context.cursor(table.name) or {}).get("seq", 0)
        failure = dataset.failures.get(table.name)
        emitted = 0
        for row in sorted(dataset.tables.get(table.name, []), key=lambda r: r["seq"]):
            if row["seq"] <= since:
                continue
            if failure is not None and emitted == failure[0]:
                raise failure[1]
            yield row
            emitted += 1
            yield Checkpoint({"seq": row["seq"]})
        for gone in dataset.deletions.get(table.name, []):
            yield Deleted(gone)


@register
class MemoryPagesConnector(Connector[MemoryConfig]):
    """A full table read page by page like a page-numbered API: after each page it yields the
    number of the next one as its position, and resumes there. `reads` logs "items:PAGE" for
    every page read; a failure at row index N (see Dataset.failures) strikes on the page that
    holds it."""

    provider = "memory_pages"
    tables = (Table("items", "id", Mode.FULL),)
    config_model = MemoryConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        dataset = DATASETS[config.dataset]
        rows = list(dataset.tables.get(table.name, []))
        failure = dataset.failures.pop(table.name, None)  # strikes once
        size = config.page_size
        page = int((self.context.position(table.name) or {}).get("page", 1))
        yield Total(len(rows))
        while (page - 1) * size < len(rows):
            with _lock:
                dataset.reads.append(f"{table.name}:{page}")
            start = (page - 1) * size
            if failure is not None and start <= failure[0] < start + size:
                raise failure[1]
            yield rows[start : start + size]
            page += 1
            if (page - 1) * size < len(rows):
                yield Position({"page": page})


class FileConfig(BaseModel):
    path: str
    # A test's handle on a worker process, at a known point of the table: the first reader
    # that reaches row `pause_after` (counting from 0) creates the file `pause_flag` and stops
    # its own process with SIGSTOP; the test acts on it (tests.waiting.wait_stopped), then
    # sends SIGCONT. Readers after it find the flag and read on.
    pause_after: int | None = None
    pause_flag: str | None = None


@register
class FileDataConnector(Connector[FileConfig]):
    """Reads {"items": [...]} from a JSON file, re-read at the start of each table."""

    provider = "filedata"
    tables = (Table("items", "id", Mode.FULL),)
    config_model = FileConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        with open(config.path) as handle:
            rows = json.load(handle).get(table.name, [])
        for index, row in enumerate(rows):
            if index == config.pause_after and config.pause_flag:
                flag = Path(config.pause_flag)
                if not flag.exists():
                    flag.write_text(str(os.getpid()))
                    os.kill(os.getpid(), signal.SIGSTOP)
            yield row


class SleepyConfig(BaseModel):
    sleep_ms: float = 2.0
    rows: int = 0


class _Sleepy(Connector[SleepyConfig]):
    tables = (Table("items", "id", Mode.FULL),)
    config_model = SleepyConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        time.sleep(config.sleep_ms / 1000)
        for i in range(config.rows):
            yield {"id": i, "value": i}


# Three providers for the limiter stress.
for _name in ("sleepy_a", "sleepy_b", "sleepy_c"):
    register(type(f"Sleepy_{_name}", (_Sleepy,), {"provider": _name}))
