"""HTTP: the server the daemon serves on, and what reaches it.

- ``server.py``: ``/``, ``/metrics`` (text, OpenMetrics, gzip), ``/healthz``, push routes;
  the handler a worker runs over a whole request;
- ``connections.py``: the selector thread (accept, TLS handshakes, requests read under
  deadlines, room made at a full cap) and the workers;
- ``framing.py``: where a request head ends, and the body it announces;
- ``output.py``: an answer sent as far as the kernel takes it, the rest queued;
- ``listen.py``: the ``listen`` address and the ``http`` section (caps, deadlines);
- ``limits.py``: connection caps (global, per client IP), the open-file budget, and the
  refusal, eviction and timeout counters;
- ``peer.py``: the local user behind a loopback connection, and who listens on a port
  of this host (``listener_owner``: the uid and the process), as the kernel names them;
- ``webconfig.py``: the exporter-toolkit web config (TLS, client certificates, basic auth);
- ``certificates.py``: the TLS context, loaded again when its files change (a renewed
  certificate), and the served certificate's expiry;
"""
