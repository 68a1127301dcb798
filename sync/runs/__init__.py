"""The kind of sync runs: a connection's sync or purge, claimed and held by the worker's main
slot, its outcome decided and applied.

- ``kind``: the run as a kind of leased work (its claim, lease, handling, decision, writes);
- ``context``: what the connector sees of the engine;
- ``sync``: the sync, table by table and slice by slice (``slices``), with its tombstone pass
  (``tombstones``), through the record writer (``records``) and its checkpoints;
- ``purge``: the purge of a deleted connection;
- ``decide``: the run's pure decision; ``outcome``: its application through the store.
"""
