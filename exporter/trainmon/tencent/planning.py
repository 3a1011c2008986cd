"""Pure planning arithmetic of the puller: windows, periods, names, intervals.

* ``window`` — the request window: ``periods`` Cloud Monitor periods ending
  at the latest period that closed at least ``delay`` seconds before now;
* ``plan_metrics`` — each catalogue metric matched case-insensitively to what
  ``DescribeBaseMetrics`` offers (the API's spelling is the one to pull), its
  period snapped with ``snap_period``;
* ``plan_interval`` — seconds between refreshes: one period, or whole periods
  when the calls cannot finish inside 90 % of one at the configured rate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainmon.tencent.catalogue import MetricSpec

log = logging.getLogger(__name__)

#: lower-case metric name → (the API's spelling, supported periods in seconds)
Offered = Mapping[str, tuple[str, list[int]]]


@dataclass(frozen=True)
class PlannedMetric:
    spec: MetricSpec
    #: The name as DescribeBaseMetrics spells it (used in GetMonitorData).
    api_name: str
    #: Statistics period in seconds, one the metric supports.
    period: int


def window(now: float, period: int, delay: int, periods: int) -> tuple[int, int, int]:
    """(StartTime, EndTime, latest period start) of the request window, Unix seconds.

    The latest complete period is the one that ended at or before
    ``now - delay``; the window spans ``periods`` periods up to its end.
    """
    end = math.floor((now - delay) / period) * period
    latest = end - period
    return latest - (periods - 1) * period, end, latest


def plan_interval(calls: int, rate: float, period: int, base: float | None = None) -> float:
    """Seconds between refreshes: ``base`` (default one period), or whole periods
    when ``calls`` at ``rate`` per second need more than 90 % of it."""
    interval = base or float(period)
    needed = calls / rate
    if needed <= 0.9 * interval:
        return interval
    return float(period * math.ceil(needed / (0.9 * period)))


def snap_period(wanted: int, supported: Sequence[int]) -> int:
    """The smallest supported period not below ``wanted``, else the largest."""
    if not supported or wanted in supported:
        return wanted
    above = [p for p in supported if p >= wanted]
    return min(above) if above else max(supported)


def offered_metrics(answer: object) -> dict[str, tuple[str, list[int]]]:
    """What a ``DescribeBaseMetrics`` answer offers (its ``MetricSet``)."""
    offered: dict[str, tuple[str, list[int]]] = {}
    metric_set = answer.get("MetricSet") if isinstance(answer, dict) else None
    for item in metric_set if isinstance(metric_set, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("MetricName"), str):
            continue
        raw = item.get("Period")
        periods = [int(p) for p in raw if isinstance(p, int)] if isinstance(raw, list) else []
        offered[item["MetricName"].lower()] = (item["MetricName"], periods)
    return offered


def plan_metrics(
    specs: Sequence[MetricSpec], offered: Mapping[str, Offered], period: int
) -> tuple[PlannedMetric, ...]:
    """Match ``specs`` to what each namespace offers.

    A namespace missing from ``offered`` (DescribeBaseMetrics failed) keeps the
    catalogue's names and ``period`` unvalidated; a metric its namespace does
    not offer is skipped with a warning.
    """
    plan = []
    for spec in specs:
        known = offered.get(spec.namespace)
        if known is None:
            plan.append(PlannedMetric(spec, spec.tencent_name, period))
            continue
        match = known.get(spec.tencent_name.lower())
        if match is None:
            log.warning("Cloud Monitor offers no %s/%s; skipped", spec.namespace, spec.tencent_name)
            continue
        api_name, periods = match
        snapped = snap_period(period, periods)
        if snapped != period:
            log.info("%s: period %ds is not offered, using %ds", api_name, period, snapped)
        plan.append(PlannedMetric(spec, api_name, snapped))
    return tuple(plan)
