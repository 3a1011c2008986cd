"""HTTP: the server the daemon serves on, and what reaches it.

- ``server.py``: ``/``, ``/metrics`` (text, OpenMetrics, gzip), ``/healthz``, push routes;
  connection cap, per-request deadline, TLS;
- ``webconfig.py``: the exporter-toolkit web config (TLS, client certificates, basic auth);
- ``push.py``: the request/response types between the server and a collector's push routes.
"""
