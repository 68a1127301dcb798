"""A kind of leased work an application adds: webhook deliveries. It is one package and one
registration (``sync.jobs.registry.register("webhook", slots)``): it changes neither the seam
(``sync.jobs``), nor the worker, nor the lease code, and the worker's one executor gives it a
lease, an abort signal, a log, a span and metrics like any other kind."""
