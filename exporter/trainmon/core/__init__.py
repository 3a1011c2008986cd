"""The collector contract and the registry that runs collectors.

- ``collector.py``: ``Collector`` (``collect``/``start``/``stop``/``health``, and the
  routes it serves: ``push_routes``/``get_routes``) and ``CollectorUnavailable`` for an
  absent source;
- ``routes.py``: the route types between the HTTP server and collectors
  (``PushRequest``/``PushResponse``, ``GetRequest``/``JSONResponse``);
- ``registry.py``: ``CollectorRegistry``: per-collector isolation, the
  ``trainmon_collector_*`` and ``trainmon_build_info`` self-metrics, ``/healthz`` state,
  every collector's routes in one table;
- ``ownprocess.py``: the daemon's own ``process_*`` metrics;
- ``exposition.py``: ``TextEncoder``, the Prometheus text format of the families, with
  what repeats from scrape to scrape remembered;
- ``files.py``: ``read_file``, a whole procfs/sysfs file in four system calls.
- ``entry.py``: ``CollectorEntry``, what each collector module declares (its name,
  section class, factory, requirements), and the ``Wiring`` its factory receives.
"""
