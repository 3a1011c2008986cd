"""Collector isolation, the evaluation loop and the exporter's self-metrics.

``CollectorRegistry`` is what the HTTP server scrapes. It asks every collector
for its families in turn; a collector that raises loses only its own families
for that scrape. For each one it exports ``trainmon_collector_success`` and
``trainmon_collector_duration_seconds``, and it keeps the latest state of each
for ``/healthz``. It also exports ``trainmon_build_info``.

Two kinds of collectors, split by their order:

- **sources**, up to the first collector with an ``evaluation_seconds``: each
  scrape collects them afresh (showing each the families of the ones before
  it through ``Collector.observe``);
- **derived collectors**, that one and every collector after it (the
  diagnosis, then the run ledger that records its verdicts): the *evaluation
  loop* (a ``BackgroundThread``, "evaluation") collects the sources every
  ``evaluation_seconds`` whether or not anything scrapes, and shows them to
  the derived collectors in order — each one ``observe()``s the sources and
  the families of the derived ones before it, then is collected. A scrape
  never evaluates: it exports the derived collectors' families of the latest
  evaluation, and their ``_success``, ``_duration_seconds`` and ``/healthz``
  state are those of that evaluation (``pending`` before the first).

``start()`` evaluates once before it returns (so ``/healthz`` and the first
scrape tell the truth), then starts the loop; ``stop()`` ends the loop, then
stops the sources, then the derived collectors (the ledger's last flush sees
the last reports the training receiver took in). One lock serialises the sources' collections, by
scrapes and by evaluations: collectors keep state between collections
(counter wrap tracking), and two concurrent full reads of ``/proc`` buy
nothing. The derived part of an evaluation (the rules, the ledger's
bookkeeping) runs under a second lock, outside the first, so a scrape waits at
most for a source collection, never for the rules; it reads the families of
the latest complete evaluation (one reference, swapped when an evaluation ends).

A collector's ``health()`` may add a ``state`` of its own (the ledger's
``degraded``); the more severe of it and the registry's wins (``HEALTH_SEVERITY``).

prometheus_client's own registry has no such isolation: one exception there
turns the whole scrape into an HTTP 500.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from trainmon import __version__
from trainmon.background import BackgroundThread
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.core.families import GaugeMetricFamily, Metric
from trainmon.core.routes import GetHandler, PushHandler
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)


@dataclass
class CollectorState:
    """What ``/healthz`` reports about one collector."""

    state: str = "pending"  # pending | ok | failed | unavailable
    error: str | None = None
    duration_seconds: float = 0.0
    last_success_timestamp: float | None = None


#: ``/healthz`` states from the least to the most severe; of the registry's and a
#: collector's own, the more severe is reported.
HEALTH_SEVERITY = ("ok", "pending", "degraded", "unavailable", "failed")


class CollectorRegistry:
    """Scrapes the sources and evaluates the derived collectors, each in isolation;
    the object the server exposes."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        mode: str = "real",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._set_collectors(collectors)
        # Each derived collector's families of the latest evaluation, by name.
        self._evaluated: dict[str, list[Metric]] = {}
        self._evaluation = BackgroundThread("evaluation", self._evaluate_every_interval)
        self._mode = mode
        self._clock = clock
        self._wall_clock = wall_clock
        self._states = {collector.name: CollectorState() for collector in collectors}
        # A failing collector logs its error once per 5 minutes, and at once when it changes.
        self._errors_logged = LogThrottle(clock=clock)
        # The sources' collections are serialised (scrapes and evaluations): they keep
        # state between collections (counter wrap tracking) and two concurrent full
        # reads of /proc buy nothing. The derived collectors have their own lock.
        self._lock = threading.Lock()
        self._derived_lock = threading.Lock()

    def _set_collectors(self, collectors: Sequence[Collector]) -> None:
        """Split ``collectors`` into the sources and the derived ones (callers hold
        both locks, or the registry is being built)."""
        names = [collector.name for collector in collectors]
        duplicates = {name for name in names if names.count(name) > 1}
        if duplicates or "" in names:
            raise ValueError(f"collector names must be unique and non-empty: {names}")
        self._collectors = list(collectors)
        split = next((index for index, collector in enumerate(self._collectors)
                      if collector.evaluation_seconds is not None), len(self._collectors))
        self._sources = self._collectors[:split]
        self._derived = self._collectors[split:]
        self._derived_ids = {id(collector) for collector in self._derived}
        #: Seconds between two evaluations (the shortest any derived collector asks
        #: for); None without derived collectors.
        self.evaluation_seconds = min(
            (collector.evaluation_seconds for collector in self._derived
             if collector.evaluation_seconds is not None), default=None)

    def start(self) -> None:
        """Start every collector's background work, evaluate once so that
        ``/healthz`` and the first scrape tell the truth, then start the
        evaluation loop (when there are derived collectors). A collector that
        fails to start is reported as such and left out of that first
        evaluation; the others go on."""
        started = self._start_each(self._collectors)
        self._evaluate(started)
        if self.evaluation_seconds is not None:
            self._evaluation.start()

    def replace(self, collectors: Sequence[Collector],
                rewire: Callable[[], None] | None = None) -> None:
        """Serve ``collectors`` from now on (a configuration reload, ``trainmon.reload``).

        The ones already here (the same objects) keep running with their state;
        the new ones are started first, outside the locks, then the lists are
        swapped under both locks (a scrape sees the old set or the new, whole),
        then ``rewire`` runs (kept collectors turn to the new ones they read), then
        the ones left out are stopped, and one evaluation runs so that the derived
        collectors' families and ``/healthz`` are those of the new set. A collector
        that fails to start is reported as at ``start()``."""
        current = {id(collector) for collector in self._collectors}
        kept = {id(collector) for collector in collectors}
        added = [collector for collector in collectors if id(collector) not in current]
        removed = [collector for collector in self._collectors if id(collector) not in kept]
        states = {collector.name: CollectorState() for collector in added}
        with self._derived_lock, self._lock:
            # a new collector's state starts pending: its start below may record a failure
            for name, state in states.items():
                self._states[name] = state
        self._start_each(added)
        with self._derived_lock, self._lock:
            self._set_collectors(collectors)
            names = {collector.name for collector in collectors}
            self._states = {name: state for name, state in self._states.items() if name in names}
            self._evaluated = {name: families for name, families in self._evaluated.items()
                               if name in names}
        if rewire is not None:
            rewire()
        for collector in removed:
            self._stop_one(collector)
        self._evaluate(self._collectors)
        if self.evaluation_seconds is not None:
            self._evaluation.start()

    def _start_each(self, collectors: Sequence[Collector]) -> list[Collector]:
        """Start each of ``collectors``; those that started, in order."""
        started: list[Collector] = []
        for collector in collectors:
            try:
                collector.start()
            except CollectorUnavailable as reason:
                self._record(collector.name, "unavailable", str(reason), 0.0)
            except Exception as error:  # isolate: one source never takes down another
                log.exception("collector %s failed to start", collector.name)
                self._record(collector.name, "failed", _describe(error), 0.0)
            else:
                started.append(collector)
        return started

    def push_routes(self) -> dict[str, PushHandler]:
        """Every collector's ``push_routes()``; ``ValueError`` for a route claimed twice."""
        return _claimed(collector.push_routes() for collector in self._collectors)

    def get_routes(self) -> dict[str, GetHandler]:
        """Every collector's ``get_routes()``; ``ValueError`` for a route claimed twice."""
        return _claimed(collector.get_routes() for collector in self._collectors)

    def stop(self) -> None:
        """End the evaluation loop, then the sources' background work (the training
        receiver takes in what is still queued), then the derived collectors' (the
        ledger's last flush then holds the runs that ended just before the stop)."""
        self._evaluation.stop()
        for collector in [*reversed(self._sources), *reversed(self._derived)]:
            self._stop_one(collector)

    @staticmethod
    def _stop_one(collector: Collector) -> None:
        try:
            collector.stop()
        except Exception:
            log.exception("collector %s failed to stop cleanly", collector.name)

    def evaluate(self) -> None:
        """One evaluation: collect the sources, then show them to each derived
        collector in order and keep its families for the scrapes (the loop calls
        it every ``evaluation_seconds``; tests with an injected clock call it)."""
        self._evaluate(self._collectors)

    def _evaluate(self, collectors: Sequence[Collector]) -> None:
        included = {id(collector) for collector in collectors}
        with self._derived_lock:
            families: list[Metric] = []
            with self._lock:
                for collector in self._sources:
                    if id(collector) in included:
                        families.extend(self._collect_one(collector, families))
            evaluated = dict(self._evaluated)
            for collector in self._derived:
                if id(collector) in included:
                    produced = self._collect_one(collector, families)
                    evaluated[collector.name] = produced
                    families.extend(produced)
            self._evaluated = evaluated  # scrapes see whole evaluations only

    def _evaluate_every_interval(self) -> None:
        # A fixed delay after each evaluation: never two closer than the interval, read
        # again each time (a reload may change the derived collectors); without derived
        # collectors left (a reload turned them off), the loop only waits.
        while not self._evaluation.stopping.wait(self.evaluation_seconds or 60.0):
            if self.evaluation_seconds is None:
                continue
            try:
                self.evaluate()
            except Exception:  # the loop must outlive any one bad evaluation
                log.exception("evaluation failed")

    def collect(self) -> Iterator[Metric]:
        """The sources' families, collected now, the derived collectors' families
        of the latest evaluation, then the self-metrics."""
        derived = self._derived_ids
        evaluated = self._evaluated
        with self._lock:
            families: list[Metric] = []
            success = GaugeMetricFamily(
                "trainmon_collector_success",
                "1 if the collector's last collection succeeded, 0 if it failed or its "
                "source is unavailable (see /healthz for the reason).",
                labels=["collector"],
            )
            available = GaugeMetricFamily(
                "trainmon_collector_available",
                "0 if the collector's data source is absent on this machine (no NVML, no "
                "InfiniBand ports under enabled: true...), else 1. Alert on failures with "
                "trainmon_collector_success == 0 and trainmon_collector_available == 1.",
                labels=["collector"],
            )
            duration = GaugeMetricFamily(
                "trainmon_collector_duration_seconds",
                "Wall time of the collector's last collection, in seconds (for the "
                "diagnosis and the ledger: their part of the last evaluation).",
                labels=["collector"],
            )
            for collector in self._collectors:
                if id(collector) in derived:
                    families.extend(evaluated.get(collector.name, ()))
                else:
                    families.extend(self._collect_one(collector, families))
                state = self._states[collector.name]
                success.add_metric([collector.name], 1.0 if state.state == "ok" else 0.0)
                available.add_metric(
                    [collector.name], 0.0 if state.state == "unavailable" else 1.0
                )
                duration.add_metric([collector.name], state.duration_seconds)
            build_info = GaugeMetricFamily(
                "trainmon_build_info",
                "trainmon build; mode is 'demo' when the node is simulated, else 'real'.",
                labels=["version", "mode"],
            )
            build_info.add_metric([__version__, self._mode], 1.0)
            families.extend([success, available, duration, build_info])
        yield from families

    def health(self) -> dict[str, object]:
        """JSON-serialisable state of every collector, for ``/healthz``. The registry's
        lock is held only to read the collection states (a scrape or evaluation holds
        it while it collects); each collector's own ``health()`` is thread-safe."""
        with self._lock:
            states = [(collector, self._states[collector.name].state,
                       self._states[collector.name].duration_seconds,
                       self._states[collector.name].last_success_timestamp,
                       self._states[collector.name].error) for collector in self._collectors]
        report: dict[str, object] = {}
        for collector, state, duration, last_success, error in states:
            entry: dict[str, object] = {
                "state": state,
                "duration_seconds": round(duration, 6),
                "last_success_timestamp": last_success,
            }
            if error is not None:
                entry["error"] = error
            try:
                own = dict(collector.health())
            except Exception as problem:
                entry["health_error"] = _describe(problem)
            else:
                if _severity(own.get("state")) < _severity(state):
                    own.pop("state", None)
                entry.update(own)
            report[collector.name] = entry
        return {"mode": self._mode, "version": __version__, "collectors": report}

    def _collect_one(self, collector: Collector, earlier: Sequence[Metric]) -> list[Metric]:
        """``collector``'s families, after showing it the ``earlier`` ones of this
        scrape or evaluation."""
        started = self._clock()
        try:
            collector.observe(earlier)
            families = list(collector.collect())
        except CollectorUnavailable as reason:
            self._record(collector.name, "unavailable", str(reason), self._clock() - started)
            return []
        except Exception as error:  # isolate: a failing collector never fails the scrape
            self._record(collector.name, "failed", _describe(error), self._clock() - started)
            return []
        self._record(collector.name, "ok", None, self._clock() - started)
        return families

    def _record(self, name: str, state: str, error: str | None, duration: float) -> None:
        entry = self._states[name]
        entry.state = state
        entry.error = error
        entry.duration_seconds = duration
        if state == "ok":
            entry.last_success_timestamp = self._wall_clock()
            if self._errors_logged.forget(name):
                log.info("collector %s recovered", name)
            return
        if self._errors_logged.allow(name, (state, error)):
            level = logging.INFO if state == "unavailable" else logging.ERROR
            log.log(level, "collector %s %s: %s", name, state, error)


def _severity(state: object) -> int:
    """Rank of a ``/healthz`` state in ``HEALTH_SEVERITY`` (-1: none or unknown)."""
    return HEALTH_SEVERITY.index(state) if state in HEALTH_SEVERITY else -1


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


_Handler = TypeVar("_Handler")


def _claimed(declared: Iterable[Mapping[str, _Handler]]) -> dict[str, _Handler]:
    """The routes of every collector in one table; a path two collectors claim is a
    wiring error."""
    routes: dict[str, _Handler] = {}
    for table in declared:
        for path, handler in table.items():
            if path in routes:
                raise ValueError(f"two collectors claim the route {path}")
            routes[path] = handler
    return routes
