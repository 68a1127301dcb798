"""Connectors the benchmarks register (importing this module registers them)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from bench import dataset
from connectors import Connector, Mode, Table, register


@register
class NoopConnector(Connector):
    """One full table that yields nothing: the cheapest run that still does a table's work."""

    provider = "bench_noop"
    tables = (Table("items", "id", Mode.FULL),)

    def read(self, table: Table) -> Iterator[Any]:
        return iter(())


@register
class NoTablesConnector(Connector):
    """No tables at all: the queue's own cost per run, with no table bookkeeping."""

    provider = "bench_no_tables"
    tables = ()


@register
class StartMarkConnector(Connector):
    """No tables; prints the wall-clock time it was started at, for bench/latency.py."""

    provider = "bench_start_mark"
    tables = ()

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        print(f"START {time.time():.6f}", file=sys.stdout, flush=True)


class RecordsConfig(BaseModel):
    n: int
    phase: str = dataset.FIRST.name
    page_size: int = 1000


@register
class RecordsConnector(Connector[RecordsConfig]):
    """The simulated 1 KB-record table of bench/records.py, read in pages."""

    provider = "bench_records"
    tables = (Table("items", "id", Mode.FULL),)
    config_model = RecordsConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        yield from dataset.pages(config.n, dataset.phase_named(config.phase), config.page_size)


class WaitConfig(BaseModel):
    ms: float = 20.0


@register
class WaitConnector(Connector[WaitConfig]):
    """One full table that yields nothing after waiting ``ms`` on its "provider": a run that
    spends its time waiting on the network, as real syncs do, for bench/fleet.py."""

    provider = "bench_wait"
    tables = (Table("items", "id", Mode.FULL),)
    config_model = WaitConfig

    def read(self, table: Table) -> Iterator[Any]:
        config = self.context.config
        if config.ms > 0:
            self.context.sleep(config.ms / 1000)
        return iter(())


# The same under other provider names: runs of different providers in one workspace may run at
# once, so a few workspaces can still keep many workers busy (bench/fleet.py's lanes).
WAIT_PROVIDERS = ("bench_wait", *(f"bench_wait_{i}" for i in range(2, 9)))
for _name in WAIT_PROVIDERS[1:]:
    register(type(f"WaitConnector_{_name}", (WaitConnector,), {"provider": _name}))
