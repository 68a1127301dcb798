"""``python -m connectors.simulated``: run the simulated provider until interrupted, the same
program as ``python -m connectors.simulated.server`` (docs/simulated-provider.md)."""

from connectors.simulated.server import main

if __name__ == "__main__":
    main(prog="python -m connectors.simulated")
