"""On-demand profiles of training ranks (``trainmon profile``): the requests and the
file that carries them to the clients (``requests``), the traces kept beside the ledger
(``traces``) and who may ask and answer (``service``); the command is
``trainmon.runs.profile``.
docs/profiling.md."""
