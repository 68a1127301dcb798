"""Typed tables for readers, as pure decisions: the Postgres type of a value and of a model's
field (``types``), the names of schemas, views and columns (``naming``), and how a table's typed
schema evolves with what a sync wrote (``evolve``). The store publishes what they decide
(``sync.store.typed``); a sync run feeds them (``sync.runs.typed``)."""
