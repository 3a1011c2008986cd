"""``TencentPuller``, the background puller: plans GetMonitorData calls and keeps the
latest values.

One refresh, every ``refresh_interval`` seconds on its own thread (scrapes
only read the result):

1. connect — credentials and regions (``Connection``); retried every refresh
   while no source works;
2. discover targets — at start and every ``discovery_interval`` seconds
   (``targets``); a failed discovery keeps the previous targets;
3. validate metrics — with ``DescribeBaseMetrics`` per namespace, at start
   (and again every ``discovery_interval`` while it fails): ``planning`` maps
   each name case-insensitively to the API's spelling and snaps its period.
   When the call is refused the catalogue's names are pulled unvalidated;
4. pull — one ``GetMonitorData`` per metric per batch of ``batch_size``
   targets (the minimum, Σ⌈targets/batch⌉ per metric), run by ``concurrency``
   workers that all draw from the account-wide token bucket. The window is
   ``window_periods`` periods ending at the latest period that closed at least
   ``delay`` seconds ago; the newest point in it is kept per series;
5. price — when ``price_interval`` is set, the pay-as-you-go price of the
   instance types in use (``pricing``): only what is due, rarely, through the
   same client and bucket; its failures never change the refresh's state;
6. events — when ``events`` is set, the open Cloud Monitor events of the
   instance targets (``events``), every ``events.interval`` seconds through the
   same client and bucket; like prices, its failures never touch the samples
   nor the refresh's state.

An authentication failure (``AuthFailure.*``; ``UnauthorizedOperation*`` on
GetMonitorData) aborts the refresh: the remaining calls would fail the same
way, so one refresh costs at most ``concurrency`` failed calls, not a storm.

The refresh interval is the period, stretched to whole periods when the
planned calls cannot finish inside it at the configured rate; every call still
asks for the whole window, so only freshness suffers, never correctness.
``estimated_monthly_calls`` = GetMonitorData calls per refresh × refreshes in
30 days: the API is billed beyond 1 million calls per month and account.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from trainmon.background import BackgroundThread
from trainmon.logthrottle import LogThrottle
from trainmon.tencent.catalogue import MetricSpec
from trainmon.tencent.client import MONITOR, APIError, TencentAPI
from trainmon.tencent.credentials import CredentialsUnavailable
from trainmon.tencent.events import EventBook, EventSettings
from trainmon.tencent.planning import (
    PlannedMetric,
    offered_metrics,
    plan_interval,
    plan_metrics,
    window,
)
from trainmon.tencent.pricing import DEFAULT_MAX_TYPES, PriceBook
from trainmon.tencent.store import SampleStore, TencentSamples, match_datapoints
from trainmon.tencent.targets import RegionTargets, Target, TargetSource

log = logging.getLogger(__name__)

SECONDS_PER_MONTH = 30 * 86400
#: Seconds after a period becomes eligible before the aligned refresh starts.
ALIGN_OFFSET_SECONDS = 1.0
ABORTING_PREFIXES = ("AuthFailure", "UnauthorizedOperation", "CredentialsUnavailable")


@dataclass(frozen=True)
class PullSettings:
    period: int = 60
    delay: int = 120
    window_periods: int = 5
    batch_size: int = 10
    concurrency: int = 4
    #: Requests per second of the shared bucket (for planning the interval).
    rate: float = 15.0
    #: None: one period, stretched when the calls do not fit.
    refresh_interval: float | None = None
    discovery_interval: float = 600.0
    #: Start refreshes just after a new period becomes eligible (wall clock).
    align: bool = True
    #: Seconds between price lookups of an instance type; None: no prices.
    price_interval: float | None = None
    #: Most (zone, instance type) pairs priced.
    max_priced_types: int = DEFAULT_MAX_TYPES
    #: The event centre's settings; None: no events.
    events: EventSettings | None = None


@dataclass(frozen=True)
class Connection:
    """What a refresh needs: an API client, the regions and their target source."""

    api: TencentAPI
    regions: tuple[str, ...]
    targets: TargetSource


@dataclass(frozen=True)
class RefreshReport:
    calls: int
    failed: int
    aborted: str | None
    duration: float


@dataclass(frozen=True)
class PullerStatus:
    state: str  # starting | ok | degraded | failing | auth_failed | unavailable
    error: str | None = None
    credential_source: str | None = None
    regions: tuple[str, ...] = ()
    instances: int = 0
    disks: int = 0
    metrics: tuple[PlannedMetric, ...] = ()
    calls_per_refresh: int = 0
    refresh_interval: float = 0.0
    last_refresh_duration: float | None = None
    last_refresh_end: float | None = None

    @property
    def estimated_monthly_calls(self) -> float:
        if self.refresh_interval <= 0:
            return 0.0
        return self.calls_per_refresh * SECONDS_PER_MONTH / self.refresh_interval


@dataclass(frozen=True)
class _Job:
    region: str
    metric: PlannedMetric
    batch: tuple[Target, ...]


class TencentPuller:
    """Runs refreshes in the background; ``snapshot()``/``status()`` are for scrapes."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        metrics: Sequence[MetricSpec],
        settings: PullSettings,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._metrics = tuple(metrics)
        self.settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self.store = SampleStore()
        self._lock = threading.Lock()
        self._status = PullerStatus("starting")
        self._connection: Connection | None = None
        self._targets: dict[str, RegionTargets] = {}
        self._discovered_at: float | None = None
        self._plan: tuple[PlannedMetric, ...] | None = None
        self._validated = False
        self._validated_at = -math.inf
        self._thread = BackgroundThread("tencent-puller", self._run)
        self._executor: ThreadPoolExecutor | None = None
        # A repeated error (same action and code) is logged once per 5 minutes.
        self._errors_logged = LogThrottle(clock=monotonic)
        #: None when prices are not looked up.
        self.prices = None if settings.price_interval is None else PriceBook(
            interval=settings.price_interval,
            retry_interval=settings.discovery_interval,
            max_types=settings.max_priced_types,
            report=lambda error: self._log_error(error.action, error.code, str(error)),
        )
        #: None when events are not read.
        self.events = None if settings.events is None else EventBook(
            settings.events,
            report=lambda error: self._log_error(error.action, error.code, str(error)),
        )

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._thread.stop(timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _run(self) -> None:
        while not self._thread.stopping.is_set():
            started = self._monotonic()
            try:
                self.refresh()
            except Exception:  # the thread must survive anything a refresh throws
                log.exception("Tencent Cloud refresh failed unexpectedly")
            self._thread.stopping.wait(self._pause(self._monotonic() - started))

    def _pause(self, elapsed: float) -> float:
        interval = self.status().refresh_interval or float(self.settings.period)
        if not self.settings.align:
            return max(0.0, interval - elapsed)
        period, delay = self.settings.period, self.settings.delay
        target = self._clock() + max(0.0, interval - elapsed)
        # the next instant after ``target`` when (t - delay) crosses a period boundary
        eligible = math.ceil((target - delay - ALIGN_OFFSET_SECONDS) / period) * period
        return max(0.0, eligible + delay + ALIGN_OFFSET_SECONDS - self._clock())

    # -- reading ---------------------------------------------------------------

    def status(self) -> PullerStatus:
        with self._lock:
            return self._status

    def snapshot(self) -> TencentSamples:
        """Current samples; series older than the request window are left out."""
        settings, status = self.settings, self.status()
        period = max([metric.period for metric in status.metrics] or [settings.period])
        stretch = max(0.0, status.refresh_interval - period)
        horizon = settings.delay + (settings.window_periods + 1) * period + stretch
        return self.store.snapshot(self._clock() - horizon)

    # -- one refresh --------------------------------------------------------------

    def refresh(self) -> RefreshReport:
        """Run one complete refresh now (the background thread calls this)."""
        started = self._monotonic()
        connection = self._ensure_connection()
        if connection is None:
            return RefreshReport(0, 0, "unavailable", self._monotonic() - started)
        now = self._clock()
        aborted = self._discover(connection, now) or self._validate(connection, now)
        if aborted:
            return self._finish(started, 0, 0, aborted)
        jobs = list(self._jobs())
        interval = self._interval(len(jobs), self._event_calls())
        self._set(calls_per_refresh=len(jobs), refresh_interval=interval)
        failed, aborted = self._pull(connection, jobs, now)
        if not aborted:
            self._price(connection, now)
            self._read_events(connection, now)
        return self._finish(started, len(jobs), failed, aborted)

    def _ensure_connection(self) -> Connection | None:
        if self._connection is not None:
            return self._connection
        try:
            connection = self._connect()
        except CredentialsUnavailable as error:
            self._log_error("connect", "CredentialsUnavailable", f"puller cannot start: {error}")
            self._set(state="unavailable", error=str(error))
            return None
        self._connection = connection
        self._set(credential_source=connection.api.credentials.source, regions=connection.regions)
        log.info(
            "Tencent Cloud puller: regions %s, credentials from %s",
            ", ".join(connection.regions), connection.api.credentials.source,
        )
        return connection

    def _discover(self, connection: Connection, now: float) -> str | None:
        due = self._discovered_at is None or (
            connection.targets.discovers
            and now - self._discovered_at >= self.settings.discovery_interval
        )
        if not due:
            return None
        complete = True
        for region in connection.regions:
            try:
                self._targets[region] = connection.targets.resolve(region)
            except APIError as error:
                self._log_error(error.action, error.code, str(error))
                if error.is_auth_failure:
                    return str(error)
                complete = False  # keep the previous targets, try again next refresh
        if complete:
            self._discovered_at = now
        keep = {t for r in self._targets.values() for t in (*r.instances, *r.disks)}
        self.store.retain({spec.name for spec in self._metrics}, keep)
        self._set(
            instances=sum(len(r.instances) for r in self._targets.values()),
            disks=sum(len(r.disks) for r in self._targets.values()),
        )
        return None

    def _validate(self, connection: Connection, now: float) -> str | None:
        """DescribeBaseMetrics; retried every discovery interval until it worked."""
        if self._plan is not None and (
            self._validated or now - self._validated_at < self.settings.discovery_interval
        ):
            return None
        self._validated_at = now
        offered: dict[str, dict[str, tuple[str, list[int]]]] = {}
        namespaces = sorted({spec.namespace for spec in self._metrics})
        for namespace in namespaces:
            try:
                answer = connection.api.call(
                    MONITOR, "DescribeBaseMetrics", {"Namespace": namespace}, connection.regions[0]
                )
            except APIError as error:
                self._log_error(error.action, error.code, str(error))
                if error.is_auth_failure:
                    return str(error)
                log.warning("cannot validate %s metric names; pulling them unvalidated", namespace)
                continue
            offered[namespace] = offered_metrics(answer)
        self._plan = plan_metrics(self._metrics, offered, self.settings.period)
        self._validated = len(offered) == len(namespaces)
        self._set(metrics=self._plan)
        return None

    def _jobs(self) -> Iterator[_Job]:
        size = self.settings.batch_size
        for region, targets in sorted(self._targets.items()):
            for metric in self._plan or ():
                of_kind = targets.of_kind(metric.spec.kind)
                for index in range(0, len(of_kind), size):
                    yield _Job(region, metric, of_kind[index : index + size])

    def _interval(self, calls: int, other_calls: int = 0) -> float:
        """The refresh interval for ``calls`` GetMonitorData calls plus ``other_calls``
        made every refresh (the events), all at the bucket's rate."""
        settings = self.settings
        interval = plan_interval(
            calls + other_calls, settings.rate, settings.period, settings.refresh_interval
        )
        base = settings.refresh_interval or float(settings.period)
        if interval != base and interval != self.status().refresh_interval:
            log.warning(
                "%d GetMonitorData and %d other calls at %.1f/s need %.0fs; refreshing every "
                "%.0fs instead of %.0fs (raise batch_size or pull fewer metrics)",
                calls, other_calls, settings.rate, (calls + other_calls) / settings.rate,
                interval, base,
            )
        return interval

    def _pull(self, connection: Connection, jobs: list[_Job], now: float) -> tuple[int, str | None]:
        abort = threading.Event()
        reasons: list[str] = []

        def run(job: _Job) -> bool:
            if abort.is_set() or self._thread.stopping.is_set():
                return False
            try:
                self._pull_one(connection.api, job, now)
            except APIError as error:
                self._log_error(error.action, error.code, str(error))
                if error.code.startswith(ABORTING_PREFIXES):
                    reasons.append(str(error))
                    abort.set()
                return False
            return True

        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.settings.concurrency, "tencent-pull")
        outcomes = list(self._executor.map(run, jobs))
        return outcomes.count(False), (reasons[0] if reasons else None)

    def _pull_one(self, api: TencentAPI, job: _Job, now: float) -> None:
        metric = job.metric
        start, end, latest = window(
            now, metric.period, self.settings.delay, self.settings.window_periods
        )
        dimension = metric.spec.kind.dimension
        params = {
            "Namespace": metric.spec.namespace,
            "MetricName": metric.api_name,
            "Period": metric.period,
            "StartTime": _iso(start),
            "EndTime": _iso(end),
            "Instances": [
                {"Dimensions": [{"Name": dimension, "Value": target.object_id}]}
                for target in job.batch
            ],
        }
        answer = api.call(MONITOR, "GetMonitorData", params, job.region)
        results = match_datapoints(answer, job.batch, metric.spec, latest)
        self.store.update(metric.spec.name, metric.period, results)

    def _price(self, connection: Connection, now: float) -> None:
        if self.prices is None or self._thread.stopping.is_set():
            return
        instances = {
            target: region.placements.get(target.object_id)
            for region in self._targets.values()
            for target in region.instances
        }
        self.prices.refresh(connection.api, connection.targets, instances, now)

    def _instance_ids(self) -> dict[str, list[str]]:
        return {
            region: [target.object_id for target in targets.instances]
            for region, targets in self._targets.items()
        }

    def _event_calls(self) -> int:
        if self.events is None:
            return 0
        return EventBook.planned_calls(self._instance_ids())

    def _read_events(self, connection: Connection, now: float) -> None:
        if self.events is None or self._thread.stopping.is_set():
            return
        self.events.refresh(connection.api, self._instance_ids(), now)

    def _finish(
        self, started: float, calls: int, failed: int, aborted: str | None
    ) -> RefreshReport:
        duration = self._monotonic() - started
        if aborted:
            state, error = "auth_failed", aborted
        elif calls and failed == calls:
            state, error = "failing", f"all {calls} GetMonitorData calls failed"
        elif failed:
            state, error = "degraded", f"{failed} of {calls} GetMonitorData calls failed"
        else:
            state, error = "ok", None
        self._set(
            state=state, error=error, last_refresh_duration=duration,
            last_refresh_end=self._clock(),
        )
        return RefreshReport(calls, failed, aborted, duration)

    def _set(self, **changes: object) -> None:
        with self._lock:
            self._status = replace(self._status, **changes)  # type: ignore[arg-type]

    def _log_error(self, action: str, code: str, message: str) -> None:
        """Log an error once, then at most every five minutes per action and code."""
        suppressed = self._errors_logged.admit((action, code))
        if suppressed is None:
            return
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        log.warning("Tencent Cloud %s%s", message, more)


def _iso(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat()


