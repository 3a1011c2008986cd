"""HTTP: the server the daemon serves on, and what reaches it.

- ``server.py``: ``/``, ``/metrics`` (text, OpenMetrics, gzip), ``/healthz``, push routes;
  deadlines for the request head and the whole request, TLS;
- ``limits.py``: connection caps (global, per client IP) and the refusal/timeout counters;
- ``peer.py``: the local user behind a loopback connection, as the kernel names it;
- ``webconfig.py``: the exporter-toolkit web config (TLS, client certificates, basic auth);
- ``push.py``: the request/response types between the server and a collector's push routes.
"""
