"""Tencent Cloud Monitor metrics of a fleet of GPU CVMs and their CBS disks.

The ``tencent`` collector runs once per account (a Deployment, never per node).
A background ``TencentPuller`` calls ``GetMonitorData`` within the account's
rate limit; ``collect()`` only reads its latest values, so a scrape never
waits for, nor triggers, an API call. Values are in base units; every
dimension of the API's answer is a label (``instance_id``, ``disk_id``, plus
e.g. ``minor_number`` for per-GPU answers), and ``region`` is added.

``trainmon_tencent_gpu_price_per_hour`` is the pay-as-you-go price of one
GPU of each instance for an hour (``trainmon.tencent.pricing``), in the
configured ``currency``. ``trainmon_tencent_event_info`` and
``trainmon_tencent_event_start_timestamp_seconds`` are the open events of the
instances in Cloud Monitor's event centre (``trainmon.tencent.events``), each
with its category (``gpu_fault``, ``host_fault``, ``maintenance``,
``migration``, ``other``). Self-metrics (``trainmon_tencent_api_*``, sample age,
estimated monthly calls) show what the puller costs and whether its data is
fresh. Secrets never appear in metrics, logs or ``/healthz``: only the
credential *source* does.
The ``collectors.tencent`` section (``TencentConfig``) is declared here, read
by ``trainmon.section.read_section``; docs/tencent-cloud.md explains every key.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.core.entry import CollectorEntry, Wiring
from trainmon.core.families import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from trainmon.section import ConfigError, Invalid, Section, setting
from trainmon.tencent.catalogue import TargetKind, select

if TYPE_CHECKING:
    from trainmon.tencent.puller import Connection, PullerStatus, RefreshReport

# The puller side (client, credentials, puller, rate limit, targets: the TC3 signer,
# hmac, a thread pool) is imported by the collector that uses it, not with this module:
# every daemon reads the section, only the Tencent puller runs it (docs/benchmarks.md,
# "Resident memory of the node daemon").

log = logging.getLogger(__name__)

#: GetMonitorData's documented per-request object limit.
DOCUMENTED_BATCH_LIMIT = 10


def _url(value: str) -> str:
    if not re.fullmatch(r"https?://[^/\s]+/?", value):
        raise ValueError(f"expected http(s)://host[:port], got {value!r}")
    return value.rstrip("/")


def _secret_reference(section: Section, key: str, default: str | None) -> str | None:
    """A secret, accepted only as a ``${VAR}`` reference so it never sits in the file."""
    raw = section.raw(key)
    if raw is None:
        return None
    if not isinstance(raw, str) or not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", raw):
        raise ConfigError(
            section.key_path(key),
            "must be a ${VAR} reference to an environment variable (or use a *_file key); "
            "secrets are not written into configuration files",
        )
    return section.optional_string(key)


def _known_metrics(metrics: tuple[str, ...]) -> tuple[str, ...]:
    """Names of the metric catalogue (``trainmon.tencent.catalogue``); ValueError if not."""
    select(metrics)
    return metrics


def _currency(value: str) -> str:
    if not re.fullmatch(r"[A-Z]{3}", value):
        raise ValueError(f"expected an ISO 4217 code such as CNY or USD, got {value!r}")
    return value


def _event_categories(value: Mapping[str, str]) -> Mapping[str, str]:
    """Event name → category; ValueError for a category trainmon does not know."""
    if not value:
        return value
    from trainmon.tencent.events import CATEGORIES  # the puller side, only when set

    for name, category in value.items():
        if category not in CATEGORIES:
            raise ValueError(
                f"{name}: unknown category {category!r}; expected one of {', '.join(CATEGORIES)}"
            )
    return value


def _between(minimum: float, maximum: float) -> dict[str, object]:
    return setting(minimum=minimum, maximum=maximum)


@dataclass(frozen=True)
class TencentConfig:
    """The ``collectors.tencent`` section: the Cloud Monitor puller (docs/tencent-cloud.md
    explains every key). Secrets are accepted only as ``${VAR}`` references or files,
    never inline."""

    enabled: bool = False
    #: Monitor API endpoint; cvm./cbs. hosts are derived from a monitor.* host.
    endpoint: str = field(
        default="https://monitor.tencentcloudapi.com", metadata=setting(parse=_url))
    #: None: this CVM's region from the metadata service.
    region: str | None = None
    #: Several regions (discovery only); overrides ``region``.
    regions: tuple[str, ...] = ()
    secret_id: str | None = field(default=None, repr=False)
    #: Only ever a ``${VAR}`` reference in the file (checked when parsing).
    secret_key: str | None = field(
        default=None, repr=False, metadata=setting(read=_secret_reference))
    secret_key_file: Path | None = None
    session_token: str | None = field(
        default=None, repr=False, metadata=setting(read=_secret_reference))
    #: CAM role of the CVM; None: the role the metadata service lists.
    role: str | None = None
    metadata_url: str = field(
        default="http://metadata.tencentyun.com", metadata=setting(parse=_url))
    instances: tuple[str, ...] = ()
    disks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Tag filters for DescribeInstances when ``instances`` is empty.
    discovery_tags: Mapping[str, str] = field(default_factory=dict)
    discover_disks: bool = True
    discovery_interval_seconds: float = field(default=600.0, metadata=_between(10, 86400))
    #: Tencent metric names to pull; empty: the whole catalogue.
    metrics: tuple[str, ...] = field(default=(), metadata=setting(parse=_known_metrics))
    period_seconds: int = field(default=60, metadata=_between(1, 86400))
    delay_seconds: int = field(default=120, metadata=_between(0, 86400))
    window_periods: int = field(default=5, metadata=_between(1, 60))
    batch_size: int = field(default=10, metadata=_between(1, 50))
    rate_limit: float = field(default=15.0, metadata=_between(0.1, 20))
    concurrency: int = field(default=4, metadata=_between(1, 32))
    request_timeout_seconds: float = field(default=10.0, metadata=_between(0.1, 120))
    max_retries: int = field(default=2, metadata=_between(0, 10))
    #: Look up the pay-as-you-go price of the instance types (DescribeZoneInstanceConfigInfos).
    prices: bool = True
    #: Seconds between price lookups of one instance type in one zone.
    price_interval_seconds: float = field(default=21600.0, metadata=_between(60, 7 * 86400))
    #: Most (zone, instance type) pairs priced; the rest are counted.
    max_priced_types: int = field(default=64, metadata=_between(1, 1000))
    #: The currency of the prices (the API does not say): CNY on the Chinese site, USD on
    #: the international one.
    currency: str = field(default="CNY", metadata=setting(parse=_currency))
    #: Read the open events of the instances (Cloud Monitor DescribeProductEventList).
    events: bool = True
    #: Seconds between two rounds of event reads.
    events_interval_seconds: float = field(default=60.0, metadata=_between(30, 3600))
    #: How far back events are asked for (StartTime = now − this).
    events_lookback_seconds: float = field(default=86400.0, metadata=_between(600, 30 * 86400))
    #: Most events read per round; those past it are counted.
    max_events: int = field(default=500, metadata=_between(1, 10000))
    #: Event name → category, before the built-in table (docs/tencent-cloud.md).
    event_categories: Mapping[str, str] = field(
        default_factory=dict, metadata=setting(parse=_event_categories))

    @property
    def target_regions(self) -> tuple[str | None, ...]:
        """The regions to pull; ``(None,)`` means "ask the metadata service"."""
        return self.regions or (self.region,)

    def check(self) -> None:
        """Rules between keys of an enabled section (a disabled one may be partial)."""
        if not self.enabled:
            return
        checks = [
            ("secret_key_file", self.secret_key and self.secret_key_file,
             "set secret_key or secret_key_file, not both"),
            ("secret_id", self.secret_id and not (self.secret_key or self.secret_key_file),
             "secret_id needs secret_key or secret_key_file"),
            ("secret_key", (self.secret_key or self.secret_key_file) and not self.secret_id,
             "secret_key needs secret_id"),
            ("regions", self.region and self.regions, "set region or regions, not both"),
            ("instances", self.instances and len(self.regions) > 1,
             "static instances need a single region; use discovery_tags for several regions"),
            ("disks", self.disks and not self.instances,
             "disks needs instances (with discovery, disks are discovered too)"),
            ("discovery_tags", self.discovery_tags and self.instances,
             "discovery_tags has no effect when instances are listed"),
        ]
        for key, failed, message in checks:
            if failed:
                raise Invalid(key, message)


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
        from trainmon.tencent.client import APIStats
        from trainmon.tencent.events import EventSettings
        from trainmon.tencent.puller import PullSettings, TencentPuller
        from trainmon.tencent.ratelimit import TokenBucket

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
            price_interval=config.price_interval_seconds if config.prices else None,
            max_priced_types=config.max_priced_types,
            events=EventSettings(
                interval=config.events_interval_seconds,
                lookback=config.events_lookback_seconds,
                max_events=config.max_events,
                categories=dict(config.event_categories),
            ) if config.events else None,
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
        from trainmon.tencent.client import TencentAPI
        from trainmon.tencent.credentials import (
            MetadataService,
            resolve_credentials,
            resolve_region,
        )
        from trainmon.tencent.puller import Connection
        from trainmon.tencent.targets import TargetSource

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
        yield from self._price_families()
        yield from self._event_families()
        yield from self._api_families()
        yield from self._puller_families(status)

    def _price_families(self) -> Iterable[Metric]:
        if self._puller.prices is None:
            return
        prices = self._puller.prices.snapshot()
        if prices.series:
            family = GaugeMetricFamily(
                "trainmon_tencent_gpu_price_per_hour",
                "Pay-as-you-go price of one GPU of the instance for one hour, after the "
                "account's discount (DescribeZoneInstanceConfigInfos), in the currency label.",
                labels=["instance_id", "instance_type", "zone", "currency"],
            )
            for price in prices.series:
                family.add_metric(
                    [price.instance_id, price.instance_type, price.zone, self._config.currency],
                    price.per_gpu_hour,
                )
            yield family
        yield CounterMetricFamily(
            "trainmon_tencent_price_types_skipped_total",
            "(zone, instance type) pairs left unpriced by max_priced_types, counted at every "
            "round of price lookups.",
            value=prices.skipped_types,
        )

    def _event_families(self) -> Iterable[Metric]:
        if self._puller.events is None:
            return
        events = self._puller.events.snapshot()
        if events.events:
            info = GaugeMetricFamily(
                "trainmon_tencent_event_info",
                "1 per open Cloud Monitor event of an instance (DescribeProductEventList, "
                "product cvm): category gpu_fault, host_fault, maintenance, migration or other; "
                "status as the API gives it (alarm: not recovered, -: no recovery concept).",
                labels=["instance_id", "event", "category", "status"],
            )
            start = GaugeMetricFamily(
                "trainmon_tencent_event_start_timestamp_seconds",
                "Unix time the open Cloud Monitor event started (its StartTime).",
                labels=["instance_id", "event"],
            )
            for event in events.events:
                info.add_metric([event.instance_id, event.event, event.category, event.status], 1)
                start.add_metric([event.instance_id, event.event], event.start)
            yield from (info, start)
        yield CounterMetricFamily(
            "trainmon_tencent_events_skipped_total",
            "Cloud Monitor events left unread by max_events, by the answers' Total, summed "
            "over the rounds of event reads.",
            value=events.skipped,
        )

    def _api_families(self) -> Iterable[Metric]:
        from trainmon.tencent.client import DURATION_BUCKETS

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
            "priced_instances": (
                None if self._puller.prices is None
                else len(self._puller.prices.snapshot().series)
            ),
            "open_events": (
                None if self._puller.events is None
                else len(self._puller.events.snapshot().events)
            ),
            "last_refresh_end": status.last_refresh_end,
        }


def _build(config: TencentConfig, wiring: Wiring) -> Collector:
    return TencentCollector(config)


#: Off in demo mode: the simulated node's data would mix with the account's real data.
ENTRY = CollectorEntry("tencent", TencentConfig, _build, real_only=True)
