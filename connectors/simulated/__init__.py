"""A simulated SaaS provider shipped with connector-sync, for the demo, the tests and anyone
trying the engine without an account anywhere: a local HTTP server (``server``) with two APIs,
a project tracker and a CRM, and a connector for each (``connector``): providers ``simulated``
and ``simulated_crm``. See docs/simulated-provider.md."""

from connectors.simulated.connector import SimulatedConfig, SimulatedCrm, SimulatedTracker
from connectors.simulated.server import Simulation, Tenant, start_server

__all__ = [
    "SimulatedConfig",
    "SimulatedCrm",
    "SimulatedTracker",
    "Simulation",
    "Tenant",
    "start_server",
]
