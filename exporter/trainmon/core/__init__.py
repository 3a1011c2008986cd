"""The collector contract and the registry that runs collectors.

- ``collector.py``: ``Collector`` (``collect``/``start``/``stop``/``health``/``push_routes``)
  and ``CollectorUnavailable`` for an absent source;
- ``registry.py``: ``CollectorRegistry``: per-collector isolation, the
  ``trainmon_collector_*`` and ``trainmon_build_info`` self-metrics, ``/healthz`` state;
- ``ownprocess.py``: the daemon's own ``process_*`` metrics.
"""
