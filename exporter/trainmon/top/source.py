"""Where ``trainmon top`` reads its snapshots: a daemon, or a Prometheus server.

- ``DaemonSource``: a daemon's ``/metrics`` (``--url``, or the local daemon that
  ``doctor`` finds: ``trainmon.doctor.find_daemon``), read with ``doctor``'s
  ``read_metrics``. A daemon on this node is read only while the kernel names a
  trusted owner for its listening socket (``trainmon.local_daemon.TrustedDaemon``,
  as for ``doctor``): checked before the first read and again after any failed
  one (a daemon that went away leaves its port to whoever binds it next), and
  ``confirm``-ed after every read. ``changed`` tells the caller that the process
  read is another than before (its counters start again).
- ``FederationSource``: Prometheus' federation endpoint (``/federate``) for the
  ``trainmon_*`` series of one node (``instance``), the latest sample of each as
  Prometheus text, so the same parser and engine read it. Each snapshot is dated
  by its samples' timestamp (the node's last scrape), not by when it was fetched:
  rates span the time between two scrapes, and a fetch that finds no newer scrape
  adds nothing (``Recorder.add``). ``nodes_of_job`` finds the nodes a job runs on
  (``trainmon_training_rank_info{job=…}``).

Both raise ``trainmon.doctor.MeasurementError`` (or ``UntrustedDaemon``) when
nothing could be read; ``top`` shows it and keeps trying.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import requests

from trainmon.diagnosis.samples import ScrapedSamples
from trainmon.doctor import MeasurementError, metrics_url, read_metrics, request_error_text
from trainmon.local_daemon import DaemonTrust, TrustedDaemon, UntrustedDaemon
from trainmon.runs.prometheus import PrometheusError, promql_string
from trainmon.runs.prometheus import PrometheusSource as PrometheusQueries
from trainmon.top.model import TOP_SAMPLES

if TYPE_CHECKING:
    from prometheus_client.core import Metric

#: HTTP timeout of one read (seconds): below the refresh, so a hung server costs one frame.
READ_TIMEOUT_SECONDS = 2.0


class SnapshotSource(Protocol):
    #: What the header names (``http://127.0.0.1:19400/metrics``).
    name: str

    def read(self) -> ScrapedSamples:
        """One snapshot; ``MeasurementError`` or ``UntrustedDaemon`` when none."""

    def changed(self) -> bool:
        """Whether the last read came from another process than the one before."""


class DaemonSource:
    """A daemon's ``/metrics``, checked as ``doctor`` checks it."""

    def __init__(self, url: str, trust: DaemonTrust, *,
                 session: requests.Session | None = None,
                 timeout: float = READ_TIMEOUT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.name = metrics_url(url)
        self._trust = trust
        self._http = session if session is not None else requests.Session()
        self._timeout = timeout
        self._clock = clock
        self._wall_clock = wall_clock
        self._daemon: TrustedDaemon | None = None
        self._checked_again = False

    def read(self) -> ScrapedSamples:
        if self._daemon is None:
            self._daemon = TrustedDaemon.check(self.url, self._trust)
            self._checked_again = True
        try:
            snapshot = read_metrics(self._http, self.name, timeout=self._timeout,
                                    at=self._clock(), wall=self._wall_clock(),
                                    names=TOP_SAMPLES)
            self._daemon.confirm()
        except (MeasurementError, UntrustedDaemon):
            self._daemon = None  # checked again before the next read
            raise
        return snapshot

    def changed(self) -> bool:
        changed, self._checked_again = self._checked_again, False
        return changed

    def describe(self) -> str:
        """Which process answers (``TrustedDaemon.describe``), once one was checked."""
        return self.name if self._daemon is None else self._daemon.describe()


class FederationSource:
    """One node's ``trainmon_*`` series through a Prometheus server's federation."""

    def __init__(self, url: str, instance: str, *,
                 session: requests.Session | None = None,
                 timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.base = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
        self.instance = instance
        self.name = f"{self.base} instance={instance}"
        self._http = session if session is not None else requests.Session()
        self._timeout = timeout

    def read(self) -> ScrapedSamples:
        target = f"{self.base}/federate"
        selector = f'{{__name__=~"trainmon_.+",instance={promql_string(self.instance)}}}'
        try:
            response = self._http.get(target, params={"match[]": selector},
                                      timeout=self._timeout)
            response.raise_for_status()
            text = response.text
        except requests.RequestException as error:
            raise MeasurementError("cannot_read", target, request_error_text(error)) from None
        # Here, not above: only the commands parse text (tests/test_footprint.py).
        from prometheus_client.parser import text_string_to_metric_families

        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as error:
            raise MeasurementError("not_prometheus", target, str(error)) from None
        stamps = [float(sample.timestamp) for family in families for sample in family.samples
                  if sample.timestamp is not None]
        if not stamps:
            raise MeasurementError("cannot_read", target,
                                   f"no trainmon series of instance {self.instance!r}")
        newest = max(stamps)
        return ScrapedSamples.from_families(_as_exported(families), newest, newest, TOP_SAMPLES)

    def changed(self) -> bool:
        return False

    def describe(self) -> str:
        return self.name


def _as_exported(families: list[Metric]) -> list[Metric]:
    """The series as the daemon exported them: without the target labels Prometheus
    added, ``instance``, and ``job`` where it is the scrape job's name (the ``job`` of
    ``trainmon_build_info``, which the daemon exports without one; with
    ``honor_labels: true`` a training job's series keep their own)."""
    scrape_job = next((sample.labels.get("job") for family in families
                       for sample in family.samples if sample.name == "trainmon_build_info"),
                      None)
    for family in families:
        family.samples = [sample._replace(labels={
            name: value for name, value in sample.labels.items()
            if name != "instance" and not (name == "job" and value == scrape_job)})
            for sample in family.samples]
    return families


def nodes_of_job(url: str, job: str, *, session: requests.Session | None = None,
                 timeout: float = READ_TIMEOUT_SECONDS) -> list[str]:
    """The ``instance`` of every node whose daemon exports a rank of ``job`` now;
    ``MeasurementError`` when Prometheus cannot answer."""
    prometheus = PrometheusQueries(url, session=session, timeout=timeout)
    query = f"count by (instance) (trainmon_training_rank_info{{job={promql_string(job)}}})"
    try:
        result = prometheus.query(query, time.time())
    except PrometheusError as error:
        raise MeasurementError("cannot_read", prometheus.url, str(error)) from None
    return sorted(str(series["metric"].get("instance", "")) for series in result)
