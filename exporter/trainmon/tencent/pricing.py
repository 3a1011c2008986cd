"""The pay-as-you-go price of each monitored GPU instance, per GPU-hour.

Source: CVM ``DescribeZoneInstanceConfigInfos`` (version 2017-03-12), one call
per (region, zone) for up to 100 instance types, filtered by ``zone``,
``instance-type`` and ``instance-charge-type`` = ``POSTPAID_BY_HOUR``. Each item
of its ``InstanceTypeQuotaSet`` (an ``InstanceTypeQuotaItem``) names its
``Zone``, ``InstanceType`` and ``InstanceChargeType``, the GPUs of the type —
``GpuCount``, the physical GPU cards it maps to (below 1 for a vGPU type), else
``Gpu``, an integer count — and its ``Price`` (an ``ItemPrice``):
``UnitPriceDiscount``, the hourly price after the account's discount, else
``UnitPrice``, the hourly list price, per ``ChargeUnit`` ``HOUR``::

    price per GPU-hour = hourly price of the instance type ÷ its GPU count

A type without GPUs, without an hourly price above zero or missing from the
answer (not sold in that zone) has no price, so its instances get no series.
The API does not name the currency: the collector labels the values with
``collectors.tencent.currency`` (CNY on the Chinese site, USD on the
international one). The price is the pay-as-you-go one whatever the
instance's own billing mode.

Only the (region, zone, instance type) triples of the monitored instances are
looked up, at most ``max_types`` of them: those already priced first, then
those of the most instances; each left out is counted (``skipped_types``) at
every round of lookups. Prices change seldom, so a triple is asked for again
``interval`` seconds (6 h) after its last answer; a failed call keeps the last
known price, is logged and counted by the client like every API error, and is
tried again after ``retry_interval`` seconds. Lookups run on the puller's
thread after its Cloud Monitor calls and draw from the same token bucket; a
scrape only reads ``snapshot()``.

Instances whose placement discovery did not tell (configured ``instances``)
are asked for with ``TargetSource.describe_placements`` every
``retry_interval`` seconds; a failure keeps the placements already known.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainmon.tencent.client import CVM, APIError, TencentAPI
from trainmon.tencent.targets import Placement, Target, TargetSource

log = logging.getLogger(__name__)

ACTION = "DescribeZoneInstanceConfigInfos"
CHARGE_TYPE = "POSTPAID_BY_HOUR"
#: Most values one filter may hold (``Filter.Values``, per the API reference).
MAX_FILTER_VALUES = 100
DEFAULT_INTERVAL_SECONDS = 6 * 3600.0
DEFAULT_MAX_TYPES = 64


@dataclass(frozen=True, order=True)
class PriceKey:
    """An instance type in one zone: what one price belongs to."""

    region: str
    zone: str
    instance_type: str


@dataclass(frozen=True)
class TypePrice:
    """The pay-as-you-go price of one instance type in one zone."""

    #: Price of one instance for one hour, after discount.
    hourly: float
    #: GPUs of the instance (``GpuCount``, else ``Gpu``); above zero.
    gpus: float

    @property
    def per_gpu_hour(self) -> float:
        return self.hourly / self.gpus


@dataclass(frozen=True, order=True)
class InstancePrice:
    """One series of ``trainmon_tencent_gpu_price_per_hour``."""

    instance_id: str
    instance_type: str
    zone: str
    #: Price of one GPU of the instance for one hour.
    per_gpu_hour: float


@dataclass(frozen=True)
class PriceSnapshot:
    series: tuple[InstancePrice, ...]
    #: Triples left unpriced by ``max_types``, summed over the rounds of lookups.
    skipped_types: int


def parse_prices(answer: Mapping[str, object], zone: str) -> dict[str, TypePrice | None]:
    """Instance type → its price in ``zone`` (None: no GPUs or no hourly price),
    for every type a ``DescribeZoneInstanceConfigInfos`` answer lists."""
    items = answer.get("InstanceTypeQuotaSet")
    if not isinstance(items, list):
        raise APIError(ACTION, "MalformedResponse", "no InstanceTypeQuotaSet in the answer")
    found: dict[str, TypePrice | None] = {}
    for item in items:
        if not isinstance(item, dict) or item.get("Zone") != zone:
            continue
        if item.get("InstanceChargeType", CHARGE_TYPE) != CHARGE_TYPE:
            continue
        instance_type = item.get("InstanceType")
        if isinstance(instance_type, str) and instance_type:
            found[instance_type] = _type_price(item)
    return found


def _type_price(item: Mapping[str, object]) -> TypePrice | None:
    gpus = _positive(item.get("GpuCount")) or _positive(item.get("Gpu"))
    price = item.get("Price")
    if gpus is None or not isinstance(price, dict):
        return None
    if price.get("ChargeUnit") not in (None, "HOUR"):
        return None
    hourly = _positive(price.get("UnitPriceDiscount")) or _positive(price.get("UnitPrice"))
    return TypePrice(hourly, gpus) if hourly is not None else None


def _positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _ignore(error: APIError) -> None:
    return None


class PriceBook:
    """The last known prices of the instance types in use; ``refresh()`` on the
    puller's thread, ``snapshot()`` from scrapes."""

    def __init__(
        self,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        retry_interval: float = 600.0,
        max_types: int = DEFAULT_MAX_TYPES,
        report: Callable[[APIError], None] = _ignore,
    ) -> None:
        self._interval = interval
        self._retry_interval = retry_interval
        self._max_types = max_types
        self._report = report
        self._known: dict[PriceKey, TypePrice | None] = {}
        self._due: dict[PriceKey, float] = {}
        self._placements: dict[Target, Placement] = {}
        self._placed_at = -math.inf
        self._lock = threading.Lock()
        self._series: tuple[InstancePrice, ...] = ()
        self._skipped = 0

    def snapshot(self) -> PriceSnapshot:
        with self._lock:
            return PriceSnapshot(self._series, self._skipped)

    def refresh(
        self,
        api: TencentAPI,
        targets: TargetSource,
        instances: Mapping[Target, Placement | None],
        now: float,
    ) -> None:
        """Look up what is due for ``instances`` (each with its placement, if known)."""
        placed = self._place(targets, instances, now)
        wanted = Counter(PriceKey(t.region, p.zone, p.instance_type) for t, p in placed.items())
        ranked = sorted(wanted, key=lambda key: (key not in self._known, -wanted[key], key))
        kept = set(ranked[: self._max_types])
        for key in [key for key in self._known if key not in kept]:
            del self._known[key]
        self._due = {key: due for key, due in self._due.items() if key in kept}
        due = sorted(key for key in kept if self._due.get(key, -math.inf) <= now)
        if due:
            skipped = len(wanted) - len(kept)
            if skipped:
                log.warning(
                    "%d instance types in use, %d over max_priced_types=%d: not priced",
                    len(wanted), skipped, self._max_types,
                )
            with self._lock:
                self._skipped += skipped
            self._look_up(api, due, now)
        series = []
        for target, placement in placed.items():
            key = PriceKey(target.region, placement.zone, placement.instance_type)
            price = self._known.get(key)
            if price is not None:
                series.append(InstancePrice(target.object_id, placement.instance_type,
                                            placement.zone, price.per_gpu_hour))
        with self._lock:
            self._series = tuple(sorted(series))

    def _place(
        self, targets: TargetSource, instances: Mapping[Target, Placement | None], now: float
    ) -> dict[Target, Placement]:
        """``instances`` with their placements; the missing ones asked for when due."""
        unplaced = [target for target, placement in instances.items() if placement is None]
        self._placements = {t: p for t, p in self._placements.items() if t in instances}
        if unplaced and now - self._placed_at >= self._retry_interval:
            self._placed_at = now
            for region in sorted({target.region for target in unplaced}):
                in_region = [target for target in unplaced if target.region == region]
                try:
                    found = targets.describe_placements(region, [t.object_id for t in in_region])
                except APIError as error:
                    self._report(error)  # keep the placements known so far
                    continue
                for target in in_region:
                    if target.object_id in found:
                        self._placements[target] = found[target.object_id]
                    else:
                        self._placements.pop(target, None)
        placed = {t: p for t, p in instances.items() if p is not None}
        placed.update((t, self._placements[t]) for t in unplaced if t in self._placements)
        return placed

    def _look_up(self, api: TencentAPI, due: Sequence[PriceKey], now: float) -> None:
        for key in due:  # a failed or abandoned lookup is tried again after retry_interval
            self._due[key] = now + self._retry_interval
        groups: dict[tuple[str, str], list[str]] = {}
        for key in due:
            groups.setdefault((key.region, key.zone), []).append(key.instance_type)
        for (region, zone), types in sorted(groups.items()):
            for index in range(0, len(types), MAX_FILTER_VALUES):
                chunk = types[index : index + MAX_FILTER_VALUES]
                params = {"Filters": [
                    {"Name": "zone", "Values": [zone]},
                    {"Name": "instance-type", "Values": chunk},
                    {"Name": "instance-charge-type", "Values": [CHARGE_TYPE]},
                ]}
                try:
                    found = parse_prices(api.call(CVM, ACTION, params, region), zone)
                except APIError as error:
                    self._report(error)  # the last known prices stay
                    if error.is_auth_failure:
                        return
                    continue
                for instance_type in chunk:
                    key = PriceKey(region, zone, instance_type)
                    self._known[key] = found.get(instance_type)
                    self._due[key] = now + self._interval
