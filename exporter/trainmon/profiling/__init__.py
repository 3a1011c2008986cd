"""On-demand profiles of training ranks (``trainmon profile``): the requests and the
file that carries them to the clients (``requests``), the traces kept beside the ledger
(``traces``), who may ask and answer (``service``), and the command (``command``).
docs/profiling.md."""
