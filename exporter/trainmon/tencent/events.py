"""The Cloud Monitor event centre's open events of the monitored CVMs.

Source: Cloud Monitor ``DescribeProductEventList`` (``monitor``, version
2018-07-24), asked per region every ``interval`` seconds with ``Module``
``monitor``, ``ProductName`` ``["cvm"]``, ``InstanceId`` = the region's
instance targets (at most ``MAX_INSTANCE_IDS`` per request), ``StartTime`` /
``EndTime`` = the last ``lookback`` seconds (Unix seconds; the API's own
default is one day), paged with ``Offset``/``Limit`` (``PAGE_SIZE``, the
documented default: no maximum is documented). The answer's ``Events[]``
carry ``EventName`` (``guest_reboot``), ``EventCName`` / ``EventEName``,
``InstanceId``, ``Status``, ``Type``, ``StartTime`` and ``UpdateTime``
(Unix seconds), and ``Total`` counts every match.

``Status`` is documented as ``recover`` (recovered), ``alarm`` (not
recovered) or ``-`` (an event without a recovery concept, e.g. a reboot);
``Type`` as ``abnormal`` or ``status_change``. Per (instance, event name)
the record with the latest ``StartTime`` counts (the documented example's
``UpdateTime`` lies exactly 8 h *before* its ``StartTime``, a time-zone slip,
so neither ordering nor the start time is taken from it): it is open unless
its status is ``recover``. The ``cvm:ErrorEvent:`` task events whose name ends
in a lifecycle state (``…Inquiring``, ``…Executing`` open; ``…Avoided``,
``…Executed``, ``…Canceled`` close) are open while no closing record of the
same task started at or after them.

``category`` (one of ``CATEGORIES``) comes from, in order: the configured
``event_categories``, the documented names of ``EVENT_CATEGORIES``, then the
words of ``KEYWORDS`` in the event's names (Tencent documents no name for a
GPU fault or a migration of a CVM: an event whose names say ``GPU`` is a
``gpu_fault``, one that says ``migrat``/``迁移`` a ``migration``), else
``other``. docs/tencent-cloud.md holds the same table.

At most ``max_events`` events are read per round; those past it that an
answer's ``Total`` reveals are counted (``skipped``), and the instances of
requests not sent once it is reached have no events until a later round. A
failed call keeps the events last known of its instances, is logged
(``report``) and counted by the client like every API error, and never
touches the Cloud Monitor samples; an
authentication failure ends the round. Rounds run on the puller's thread
after its ``GetMonitorData`` calls and draw from the same token bucket; a
scrape only reads ``snapshot()``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from trainmon.tencent.client import MONITOR, APIError, TencentAPI

ACTION = "DescribeProductEventList"
PRODUCT = "cvm"
#: ``Limit`` of every page: the documented default (no maximum is documented).
PAGE_SIZE = 20
#: Instance IDs per request (trainmon's choice: the API documents no maximum).
MAX_INSTANCE_IDS = 100
RECOVERED = "recover"
NO_STATUS = "-"
CATEGORIES = ("gpu_fault", "host_fault", "maintenance", "migration", "other")

DEFAULT_INTERVAL_SECONDS = 60.0
DEFAULT_LOOKBACK_SECONDS = 86400.0
DEFAULT_MAX_EVENTS = 500

_TASK = "cvm:ErrorEvent:"
#: Task families of the ``cvm:ErrorEvent:`` events named with a lifecycle state.
_TASK_FAMILIES = {
    "InstanceRunningRisks": "maintenance",  # 实例运行隐患: host risk, maintenance planned
    "InstanceRunningAbnormally": "host_fault",  # 实例运行异常
    "InstanceDiskError": "host_fault",  # 实例硬盘异常
    "InstanceNetworkError": "host_fault",  # 实例网络连接异常
    "InstanceNetworkJitter": "host_fault",  # 实例网络抖动
}
OPEN_STATES = ("Inquiring", "Executing")
CLOSING_STATES = ("Avoided", "Executed", "Canceled")

#: Documented CVM event names → category (docs/tencent-cloud.md, "Instance events").
EVENT_CATEGORIES: dict[str, str] = {
    # documented product events of CVM (event centre, "product event list")
    "guest_core_error": "other",  # kernel failure of the guest OS
    "guest_oom": "other",
    "ping_unreachable": "other",
    "disk_readonly": "other",
    "guest_reboot": "other",
    "nvme_error": "host_fault",  # the local NVMe device failed: the disk is replaced
    # named by DescribeAlarmEvents for the cvm_device view
    "instance_restarting": "maintenance",  # 实例计划重启（宿主机系统维护）
    "instance_restarted": "host_fault",  # 实例已重启（宿主机系统错误）
    f"{_TASK}InstanceRestarting": "maintenance",
    f"{_TASK}InstanceRestarted": "host_fault",
    f"{_TASK}NvmeError": "host_fault",
    f"{_TASK}RDMASwitchAbnormal": "host_fault",  # 实例的RDMA交换机异常
    **{
        f"{_TASK}{family}{state}": category
        for family, category in _TASK_FAMILIES.items()
        for state in (*OPEN_STATES, *CLOSING_STATES)
    },
}
#: Words of an event's names (EventName, EventEName, EventCName) → category,
#: for the names Tencent does not document. Checked in this order.
KEYWORDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"gpu", re.IGNORECASE), "gpu_fault"),
    (re.compile(r"migrat|迁移", re.IGNORECASE), "migration"),
    (re.compile(r"maint|维护|运维", re.IGNORECASE), "maintenance"),
    (re.compile(r"host|宿主机", re.IGNORECASE), "host_fault"),
)


def categorise(
    name: str, english: str = "", chinese: str = "",
    overrides: Mapping[str, str] | None = None,
) -> str:
    """The category of an event (see the module docstring for the order)."""
    if overrides and name in overrides:
        return overrides[name]
    if name in EVENT_CATEGORIES:
        return EVENT_CATEGORIES[name]
    for pattern, category in KEYWORDS:
        if any(pattern.search(text) for text in (name, english, chinese)):
            return category
    return "other"


@dataclass(frozen=True, order=True)
class OpenEvent:
    """One series of ``trainmon_tencent_event_info``."""

    instance_id: str
    #: ``EventName`` as the API spells it (``guest_reboot``).
    event: str
    category: str
    #: The API's ``Status``: ``alarm`` or ``-``.
    status: str
    #: ``StartTime``, Unix seconds.
    start: float


@dataclass(frozen=True)
class EventSnapshot:
    events: tuple[OpenEvent, ...]
    #: Events left unread by ``max_events``, summed over the rounds.
    skipped: int


@dataclass(frozen=True)
class _Record:
    instance_id: str
    name: str
    english: str
    chinese: str
    status: str
    start: float


def parse_events(answer: Mapping[str, object]) -> tuple[list[_Record], int]:
    """The usable records of one page and the answer's ``Total``."""
    items = answer.get("Events")
    if items is None:
        items = []  # "this field may return null"
    if not isinstance(items, list):
        raise APIError(ACTION, "MalformedResponse", "Events is not a list")
    total = answer.get("Total")
    records = []
    for item in items:
        if not isinstance(item, dict):
            continue
        instance, name, start = item.get("InstanceId"), item.get("EventName"), item.get("StartTime")
        if not isinstance(instance, str) or not isinstance(name, str) or not name:
            continue
        if isinstance(start, bool) or not isinstance(start, (int, float)):
            continue
        if not math.isfinite(start) or start <= 0:
            continue
        status = item.get("Status")
        records.append(_Record(
            instance, name, _text(item.get("EventEName")), _text(item.get("EventCName")),
            status if isinstance(status, str) and status else NO_STATUS,
            start / 1000.0 if start > 1e11 else float(start),  # milliseconds, defensively
        ))
    return records, total if isinstance(total, int) and not isinstance(total, bool) else 0


def open_events(
    records: Sequence[_Record], overrides: Mapping[str, str] | None = None
) -> list[OpenEvent]:
    """The open events among ``records`` (one per instance and event name)."""
    latest: dict[tuple[str, str], _Record] = {}
    closed_at: dict[tuple[str, str], float] = {}  # (instance, task family) → latest close
    for record in records:
        key = (record.instance_id, record.name)
        if key not in latest or record.start > latest[key].start:
            latest[key] = record
        family, state = _task_state(record.name)
        if family is not None and state in CLOSING_STATES:
            closing = (record.instance_id, family)
            closed_at[closing] = max(closed_at.get(closing, -math.inf), record.start)
    found = []
    for record in latest.values():
        if record.status == RECOVERED:
            continue
        family, state = _task_state(record.name)
        if family is not None and (
            state in CLOSING_STATES
            or closed_at.get((record.instance_id, family), -math.inf) >= record.start
        ):
            continue
        category = categorise(record.name, record.english, record.chinese, overrides)
        found.append(OpenEvent(record.instance_id, record.name, category, record.status,
                               record.start))
    return sorted(found)


def _task_state(name: str) -> tuple[str | None, str | None]:
    if not name.startswith(_TASK):
        return None, None
    rest = name[len(_TASK):]
    for state in (*OPEN_STATES, *CLOSING_STATES):
        if rest.endswith(state) and len(rest) > len(state):
            return rest[: -len(state)], state
    return None, None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _ignore(error: APIError) -> None:
    return None


@dataclass(frozen=True)
class EventSettings:
    """``collectors.tencent`` keys of the event centre."""

    interval: float = DEFAULT_INTERVAL_SECONDS
    lookback: float = DEFAULT_LOOKBACK_SECONDS
    max_events: int = DEFAULT_MAX_EVENTS
    #: Event name → category, before the built-in table.
    categories: Mapping[str, str] = field(default_factory=dict)


class EventBook:
    """The open events of the instance targets; ``refresh()`` on the puller's
    thread, ``snapshot()`` from scrapes."""

    def __init__(
        self, settings: EventSettings, report: Callable[[APIError], None] = _ignore
    ) -> None:
        self._settings = settings
        self._report = report
        self._asked_at = -math.inf
        self._lock = threading.Lock()
        #: instance ID → its open events (only instances whose last call worked).
        self._by_instance: dict[str, tuple[OpenEvent, ...]] = {}
        self._events: tuple[OpenEvent, ...] = ()
        self._skipped = 0

    def snapshot(self) -> EventSnapshot:
        with self._lock:
            return EventSnapshot(self._events, self._skipped)

    def due(self, now: float) -> bool:
        return now - self._asked_at >= self._settings.interval

    @staticmethod
    def planned_calls(instances: Mapping[str, Sequence[str]]) -> int:
        """Calls of one round when every answer fits one page."""
        return sum(math.ceil(len(ids) / MAX_INSTANCE_IDS) for ids in instances.values())

    def refresh(
        self, api: TencentAPI, instances: Mapping[str, Sequence[str]], now: float
    ) -> None:
        """Ask for the events of ``instances`` (region → instance IDs) when due."""
        if not self.due(now):
            return
        self._asked_at = now
        wanted = {i for ids in instances.values() for i in ids}
        known = {i: e for i, e in self._by_instance.items() if i in wanted}
        budget, skipped = self._settings.max_events, 0
        for region, chunk in _chunks(instances):
            if budget <= 0:  # max_events read: the rest are not exported
                for instance in chunk:
                    known.pop(instance, None)
                continue
            try:
                records, unread = self._read(api, region, chunk, now, budget)
            except APIError as error:
                self._report(error)  # the events last known of these instances stay
                if error.is_auth_failure:
                    break
                continue
            budget -= len(records)
            skipped += unread
            found = open_events([r for r in records if r.instance_id in chunk],
                                self._settings.categories)
            for instance in chunk:
                known[instance] = tuple(e for e in found if e.instance_id == instance)
        self._by_instance = known
        with self._lock:
            self._events = tuple(sorted(e for events in known.values() for e in events))
            self._skipped += skipped

    def _read(
        self, api: TencentAPI, region: str, chunk: Sequence[str], now: float, budget: int
    ) -> tuple[list[_Record], int]:
        """Every page of one request (at most ``budget`` events) and how many were left."""
        records: list[_Record] = []
        offset, total = 0, None
        while budget - len(records) > 0:
            limit = min(PAGE_SIZE, budget - len(records))
            params = {
                "Module": "monitor",
                "ProductName": [PRODUCT],
                "InstanceId": list(chunk),
                "StartTime": int(now - self._settings.lookback),
                "EndTime": int(now),
                "TimeOrder": "DESC",
                "Offset": offset,
                "Limit": limit,
            }
            page, total = parse_events(api.call(MONITOR, ACTION, params, region))
            records.extend(page)
            offset += limit
            if offset >= total or not page:
                break
        unread = max(0, (total or 0) - offset) if total is not None else 0
        return records, unread


def _chunks(instances: Mapping[str, Sequence[str]]) -> Iterator[tuple[str, tuple[str, ...]]]:
    for region, ids in sorted(instances.items()):
        ordered = sorted(set(ids))
        for index in range(0, len(ordered), MAX_INSTANCE_IDS):
            yield region, tuple(ordered[index : index + MAX_INSTANCE_IDS])
