"""HTTP: the server the daemon serves on, and what reaches it.

- ``server.py``: ``/``, ``/metrics`` (text, OpenMetrics, gzip), ``/healthz``, push routes;
  deadlines for the request head and the whole request, TLS;
- ``listen.py``: the ``listen`` address and the ``http`` section (caps, deadlines);
- ``limits.py``: connection caps (global, per client IP) and the refusal/timeout counters;
- ``peer.py``: the local user behind a loopback connection, and who listens on a port
  of this host (``listener_owner``: the uid and the process), as the kernel names them;
- ``webconfig.py``: the exporter-toolkit web config (TLS, client certificates, basic auth);
"""
