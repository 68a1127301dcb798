"""The one machinery every kind of leased work runs on: the lease keeper, the outcome of an
attempt, the shared rate budgets, the worker's metrics."""
