"""A simulated SaaS provider shipped with connector-sync, for the demo, the tests and anyone
trying the engine without an account anywhere: a local HTTP server (``server``) with three APIs,
a project tracker, a CRM and a document store, over the data of its tenants (``tenants``), and a
connector for each (``connector``):
providers ``simulated``, ``simulated_crm`` and ``simulated_docs``. See
docs/simulated-provider.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connectors.simulated.connector import (
    SimulatedConfig,
    SimulatedCrm,
    SimulatedDocs,
    SimulatedTracker,
)

if TYPE_CHECKING:
    from connectors.simulated.server import start_server
    from connectors.simulated.tenants import Simulation, Tenant

__all__ = [
    "SimulatedConfig",
    "SimulatedCrm",
    "SimulatedDocs",
    "SimulatedTracker",
    "Simulation",
    "Tenant",
    "start_server",
]

_SERVER_NAMES = {"Simulation", "Tenant", "start_server"}


def __getattr__(name: str) -> Any:
    # The server loads on first use, so `python -m connectors.simulated.server` runs it fresh.
    if name in _SERVER_NAMES:
        from connectors.simulated import server

        return getattr(server, name)
    raise AttributeError(f"module 'connectors.simulated' has no attribute {name!r}")
