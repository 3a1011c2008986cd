"""The contract every collector follows.

A collector owns one data source. ``collect()`` builds fresh metric families on
every call (nothing lingers when a label value disappears) and may raise: the
registry isolates failures and reports them through
``trainmon_collector_success``. Work that must run continuously (sampling,
event threads, cloud pulls) starts in ``start()`` and ends in ``stop()``;
``collect()`` then only reads its latest state.

A collector with an ``evaluation_seconds`` (the diagnosis) and every collector
registered after it are *derived*: the registry collects them on its own
clock, in its evaluation loop, not on scrapes (``trainmon.core.registry``).

A collector that serves HTTP routes declares them here, and only here:
``push_routes()`` (``POST``, the training receiver's ``/api/v1/steps``) and
``get_routes()`` (read-only JSON, the run ledger's ``/api/v1/runs``), with the
route types of ``trainmon.core.routes``. The registry gathers them
(``CollectorRegistry.push_routes``/``get_routes``) for the HTTP server; a
route two collectors claim is a wiring error.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence

from trainmon.core.families import Metric
from trainmon.core.routes import GetHandler, PushHandler


class CollectorUnavailable(Exception):
    """The source is absent on this machine (no NVML, no InfiniBand...).

    Raised from ``collect()`` or ``start()``: the registry reports the collector
    as unavailable (``trainmon_collector_success`` 0, state ``unavailable`` in
    ``/healthz``) and logs the reason once, instead of logging a failure on
    every scrape.
    """


class Collector(abc.ABC):
    """One data source exposed as Prometheus metric families."""

    #: Value of the ``collector`` label in the self-metrics and key in ``/healthz``.
    name: str = ""
    #: Seconds between two evaluations, for a collector derived on the daemon's own
    #: clock: the registry evaluates it and every collector after it that often,
    #: whether or not anything scrapes, and scrapes export the families of the
    #: latest evaluation. None (the default): collected on every scrape.
    evaluation_seconds: float | None = None

    def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (threads, sockets). Called once before serving."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Stop background work. Must be safe to call after a failed ``start``."""

    def observe(self, families: Sequence[Metric]) -> None:  # noqa: B027 - optional hook
        """Families the collectors before this one produced in the same scrape
        (in the same evaluation, for a derived collector).

        The registry calls it just before ``collect()``. A collector derived
        from the others' metrics (the diagnosis, the ledger) reads them here
        instead of collecting its sources a second time. The sequence is only
        valid until ``collect()`` returns.
        """

    @abc.abstractmethod
    def collect(self) -> Iterable[Metric]:
        """Build the current metric families. May raise; the registry isolates it."""

    def health(self) -> Mapping[str, object]:
        """Extra, JSON-serialisable state for ``/healthz`` (never secrets)."""
        return {}

    def push_routes(self) -> Mapping[str, PushHandler]:
        """HTTP routes (path → handler) through which this collector receives pushes."""
        return {}

    def get_routes(self) -> Mapping[str, GetHandler]:
        """Read-only JSON routes (path → handler) this collector serves; a path ending
        in ``/`` serves every path below it. Behind the server's basic auth."""
        return {}
