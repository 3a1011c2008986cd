"""Tencent Cloud Monitor metrics of a fleet of GPU CVMs and their CBS disks.

The ``tencent`` collector runs once per account (a Deployment, never per node).
A background ``TencentPuller`` calls ``GetMonitorData`` within the account's
rate limit; ``collect()`` only reads its latest values, so a scrape never
waits for, nor triggers, an API call. Values are in base units; every
dimension of the API's answer is a label (``instance_id``, ``disk_id``, plus
e.g. ``minor_number`` for per-GPU answers), and ``region`` is added.

Self-metrics (``trainmon_tencent_api_*``, sample age, estimated monthly calls)
show what the puller costs and whether its data is fresh. Secrets never
appear in metrics, logs or ``/healthz``: only the credential *source* does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.tencent.catalogue import TargetKind, select
from trainmon.tencent.client import DURATION_BUCKETS, APIStats, TencentAPI
from trainmon.tencent.config import TencentConfig
from trainmon.tencent.credentials import MetadataService, resolve_credentials, resolve_region
from trainmon.tencent.ratelimit import TokenBucket
from trainmon.tencent.scheduler import (
    Connection,
    PullerStatus,
    PullSettings,
    RefreshReport,
    TencentPuller,
)
from trainmon.tencent.targets import TargetSource

log = logging.getLogger(__name__)

#: GetMonitorData's documented per-request object limit.
DOCUMENTED_BATCH_LIMIT = 10


class TencentCollector(Collector):
    """Exposes the puller's latest Cloud Monitor values and its self-metrics."""

    name = "tencent"

    def __init__(
        self,
        config: TencentConfig,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_interval: float | None = None,
        align: bool = True,
    ) -> None:
        self._config = config
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._monotonic = monotonic
        self._metrics = select(config.metrics)
        self._stats = APIStats()
        self._limiter = TokenBucket(config.rate_limit, monotonic=monotonic)
        settings = PullSettings(
            period=config.period_seconds,
            delay=config.delay_seconds,
            window_periods=config.window_periods,
            batch_size=config.batch_size,
            concurrency=config.concurrency,
            rate=config.rate_limit,
            refresh_interval=refresh_interval,
            discovery_interval=config.discovery_interval_seconds,
            align=align,
        )
        self._puller = TencentPuller(
            self._connect, self._metrics, settings, clock=clock, monotonic=monotonic
        )

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        if self._config.batch_size > DOCUMENTED_BATCH_LIMIT:
            log.warning(
                "tencent.batch_size %d is above GetMonitorData's documented limit of %d objects "
                "per request; expect InvalidParameter errors unless Tencent raised it for you",
                self._config.batch_size, DOCUMENTED_BATCH_LIMIT,
            )
        self._puller.start()

    def stop(self) -> None:
        self._puller.stop()

    def refresh(self) -> RefreshReport:
        """Run one refresh synchronously (tests, one-shot tools)."""
        return self._puller.refresh()

    def _connect(self) -> Connection:
        """Resolve regions and credentials (may ask the metadata service)."""
        config = self._config
        metadata = MetadataService(config.metadata_url)
        regions = tuple(resolve_region(region, metadata) for region in config.target_regions)
        credentials = resolve_credentials(
            secret_id=config.secret_id,
            secret_key=config.secret_key,
            secret_key_file=config.secret_key_file,
            session_token=config.session_token,
            role=config.role,
            environ=self._environ,
            metadata=metadata,
            clock=self._clock,
        )
        api = TencentAPI(
            config.endpoint,
            credentials,
            limiter=self._limiter,
            stats=self._stats,
            timeout=config.request_timeout_seconds,
            max_retries=config.max_retries,
            clock=self._clock,
            monotonic=self._monotonic,
        )
        targets = TargetSource(
            api,
            instances=config.instances,
            disks=config.disks,
            tags=config.discovery_tags,
            discover_disks=config.discover_disks
            and any(spec.kind is TargetKind.DISK for spec in self._metrics),
        )
        return Connection(api, regions, targets)

    # -- scrape ------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        status = self._puller.status()
        if status.state == "unavailable" and status.last_refresh_end is None:
            raise CollectorUnavailable(status.error or "Tencent Cloud puller cannot start")
        now = self._clock()
        snapshot = self._puller.snapshot()
        for spec in self._metrics:
            samples = snapshot.series.get(spec.name, ())
            if not samples:
                continue
            family = GaugeMetricFamily(spec.name, spec.help)
            for sample in samples:
                family.add_sample(spec.name, dict(sample.labels), sample.value)
            yield family
        age = GaugeMetricFamily(
            "trainmon_tencent_sample_age_seconds",
            "Seconds since the end of the newest Cloud Monitor period received for the metric; "
            "rises while the API returns no data.",
            labels=["metric"],
        )
        for spec in self._metrics:
            if spec.name in snapshot.newest_end:
                age.add_metric([spec.name], max(0.0, now - snapshot.newest_end[spec.name]))
        yield age
        yield from self._api_families()
        yield from self._puller_families(status)

    def _api_families(self) -> Iterable[Metric]:
        stats = self._stats.snapshot()
        requests_total = CounterMetricFamily(
            "trainmon_tencent_api_requests_total",
            "Tencent Cloud API requests sent, retries included.",
            labels=["action"],
        )
        for action, count in sorted(stats.requests.items()):
            requests_total.add_metric([action], count)
        errors = CounterMetricFamily(
            "trainmon_tencent_api_errors_total",
            "Failed Tencent Cloud API requests by error code (Tencent's, or Timeout, "
            "NetworkError, MalformedResponse, HTTP<status>, CredentialsUnavailable).",
            labels=["action", "code"],
        )
        for (action, code), count in sorted(stats.errors.items()):
            errors.add_metric([action, code], count)
        duration = HistogramMetricFamily(
            "trainmon_tencent_api_request_duration_seconds",
            "Latency of Tencent Cloud API requests, seconds.",
            labels=["action"],
        )
        for action, (buckets, count, total) in sorted(stats.durations.items()):
            bounds = [str(bound) for bound in DURATION_BUCKETS] + ["+Inf"]
            duration.add_metric([action], list(zip(bounds, [*buckets, count], strict=True)), total)
        yield from (requests_total, errors, duration)
        if stats.last_success is not None:
            yield GaugeMetricFamily(
                "trainmon_tencent_last_success_timestamp_seconds",
                "Unix time of the last successful Tencent Cloud API request.",
                value=stats.last_success,
            )
        if stats.clock_skew is not None:
            yield GaugeMetricFamily(
                "trainmon_tencent_clock_skew_seconds",
                "Tencent Cloud's clock minus this host's, from the last answer's Date header "
                "(requests fail beyond 300 s).",
                value=stats.clock_skew,
            )

    def _puller_families(self, status: PullerStatus) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "trainmon_tencent_estimated_monthly_calls",
            "GetMonitorData calls per 30 days at the current plan (billed beyond 1 million "
            "per month and account).",
            value=status.estimated_monthly_calls,
        )
        targets = GaugeMetricFamily(
            "trainmon_tencent_targets", "Objects being pulled, by kind.", labels=["kind"]
        )
        targets.add_metric(["instance"], status.instances)
        targets.add_metric(["disk"], status.disks)
        yield targets
        if status.refresh_interval > 0:  # known once the calls are planned
            yield GaugeMetricFamily(
                "trainmon_tencent_refresh_interval_seconds",
                "Seconds between refreshes (a period, or whole periods when the calls do not "
                "fit).",
                value=status.refresh_interval,
            )
        if status.last_refresh_duration is not None:
            yield GaugeMetricFamily(
                "trainmon_tencent_refresh_duration_seconds",
                "Wall time of the last refresh, seconds.",
                value=status.last_refresh_duration,
            )
        yield GaugeMetricFamily(
            "trainmon_tencent_refresh_success",
            "1 if every call of the last refresh succeeded, else 0 (see /healthz for why).",
            value=1.0 if status.state == "ok" else 0.0,
        )

    def health(self) -> Mapping[str, object]:
        status = self._puller.status()
        return {
            "puller_state": status.state,
            "puller_error": status.error,
            "credential_source": status.credential_source,
            "regions": list(status.regions),
            "instances": status.instances,
            "disks": status.disks,
            "metrics": [metric.api_name for metric in status.metrics],
            "calls_per_refresh": status.calls_per_refresh,
            "refresh_interval_seconds": status.refresh_interval,
            "estimated_monthly_calls": round(status.estimated_monthly_calls),
            "last_refresh_end": status.last_refresh_end,
        }
