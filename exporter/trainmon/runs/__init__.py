"""The run ledger from the user's side: ``trainmon runs`` and ``trainmon compare``.

The daemon's recorder (``trainmon.ledger``) writes one record per run and node;
this package reads them back and says in words what changed between two runs
and how their throughput moved (tuning article §6.3: change one variable at a time,
write everything down, compare with history when "training got slower").

- ``view``: ``RunView``, one run as the commands show it, merged over the nodes
  that saw it, from the local ledger or from Prometheus;
- ``compare``: the pure comparison of two ``RunView`` s → ``Comparison``
  (changed keys, throughput, step time, phase shares, goodput, cost, the
  sentence);
- ``commands``: the commands over a source, a run named by a unique prefix of
  its id (``resolve_run``);
- ``render``: the text of both commands (English);
- ``baseline``: which earlier run a run is measured against (the previous
  comparable run, finished preferred; the fastest of the alert's look-back);
- ``regression``: ``doctor``'s run history and, after the job, the recent
  jobs' last runs;
- ``local``: the node's SQLite ledger as a source;
- ``daemon``: the local daemon's ``GET /api/v1/runs`` as a source, and the
  default choice between it and the ledger file;
- ``prometheus``: a Prometheus server (HTTP API) as a source, for runs that
  spanned many nodes, with each node daemon's ``/api/v1/runs/<run>`` for the
  descriptions;
- ``timespec``: ``--since 2d`` / ISO-8601.
"""
