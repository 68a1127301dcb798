"""The run kind of leased work: a connection's sync or purge, as one claimed run is executed
(``sync.jobs.executor``) and its outcome applied.

- ``log``: the run log, tagged with the run, connection, attempt and worker;
- ``context``: what the connector sees of the engine;
- ``sync``: the sync, table by table and slice by slice, with its tombstone pass;
- ``purge``: the purge of a deleted connection;
- ``outcome``: the decision (``retry_policy.decide``) for the run, and its application.
"""
