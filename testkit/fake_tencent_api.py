"""A loopback fake of the Tencent Cloud API 3.0 (the metadata service: ``fake_tencent_metadata``).

It behaves like the documented service where the puller depends on it:

* every request must carry a valid TC3-HMAC-SHA256 signature. The fake
  rebuilds the canonical request from the bytes it received and signs it with
  the official ``tencentcloud-sdk-python-common`` signer, so it never trusts
  trainmon's own signer; timestamps more than 300 s away from its clock give
  ``AuthFailure.SignatureExpire``; an unknown SecretId
  ``AuthFailure.SecretIdNotFound``; a wrong or missing token
  ``AuthFailure.TokenFailure``;
* the account-wide rate limit (default 20 requests in any sliding second) →
  ``RequestLimitExceeded``; the per-request object limit of GetMonitorData
  (default 10) and the 1440-points limit → ``InvalidParameterValue``;
* ``GetMonitorData`` answers in shuffled order with shuffled dimensions,
  returns empty ``Timestamps``/``Values`` for stopped instances and, for
  instances with GPUs, one data point per GPU with a ``minorNumber``
  dimension; values are a deterministic function of (metric, dimensions,
  timestamp), exposed as ``value()`` so tests can compute what to expect;
* ``DescribeBaseMetrics`` spells some names differently from Tencent's
  reference pages (``CpuUsage``, ``Gpumemusage``) and ``GetMonitorData`` only
  accepts that spelling; ``DescribeInstances``/``DescribeDisks`` page at most
  100 objects and filter by ``tag:<key>``/``tag-key``; ``DescribeInstances``
  also takes up to 100 ``InstanceIds`` (never with ``Filters``) and names each
  instance's ``InstanceType`` and ``Placement.Zone``;
* ``DescribeZoneInstanceConfigInfos`` answers the instance types a test priced
  with ``set_price()``, one ``InstanceTypeQuotaItem`` per zone, type and billing
  mode (``POSTPAID_BY_HOUR`` with an hourly ``Price``, ``PREPAID`` with a
  monthly one), honouring the ``zone``, ``instance-family``, ``instance-type``
  and ``instance-charge-type`` filters (at most 10 filters of 100 values;
  another filter name is ``InvalidFilter``);
* ``DescribeProductEventList`` answers the events a test set with
  ``add_event()`` in the documented shape (``Events[]`` with ``EventId``,
  ``EventName``, ``EventCName``/``EventEName``, ``ProductName`` ``cvm``,
  ``InstanceId``, ``Status`` ``alarm``/``recover``/``-``, ``Type``,
  ``StartTime``/``UpdateTime`` in Unix seconds, ``Dimensions``…; ``Total``,
  ``OverView``): ``Module`` must be ``monitor``; filters ``ProductName``,
  ``EventName``, ``InstanceId``, ``Type``, ``Status`` (lists) and the
  ``StartTime``/``EndTime`` window on the event's start (default: the last
  day); newest ``UpdateTime`` first (``TimeOrder`` ``DESC``, the default) or
  oldest; ``Offset``/``Limit`` paging, ``Limit`` 20 by default and at most
  ``event_page_limit`` (100: the API documents no maximum). It answers every
  region's events (the filter is ``InstanceId``);
* scripted faults: HTTP 5xx, slow answers (timeouts), malformed JSON and any
  error envelope, for the next N requests of an action.

Errors use the documented envelope: HTTP 200 with
``{"Response": {"Error": {"Code", "Message"}, "RequestId"}}``.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tencentcloud.common.sign import Sign  # type: ignore[import-untyped]

from testkit.loopback import LoopbackHTTPServer, Reply, Request

CVM_PERIODS = [10, 60, 300, 3600, 86400]
CBS_TRAFFIC_PERIODS = [60, 300, 3600, 86400]

#: namespace → {API spelling: (supported periods, per-GPU)}
METRICS: dict[str, dict[str, tuple[list[int], bool]]] = {
    "QCE/CVM": {
        "GpuUtil": (CVM_PERIODS, True),
        "Gpumemusage": (CVM_PERIODS, True),
        "GpuMemUsed": (CVM_PERIODS, True),
        "GpuMemTotal": (CVM_PERIODS, True),
        "GpuPowDraw": (CVM_PERIODS, True),
        "GpuPowLimit": (CVM_PERIODS, True),
        "GpuPowUsage": (CVM_PERIODS, True),
        "GpuTemp": (CVM_PERIODS, True),
        "CpuUsage": (CVM_PERIODS, False),
        "MemUsage": (CVM_PERIODS, False),
        "LanIntraffic": (CVM_PERIODS, False),
        "LanOuttraffic": (CVM_PERIODS, False),
        "TcpCurrEstab": (CVM_PERIODS, False),
    },
    "QCE/BLOCK_STORAGE": {
        "DiskReadIops": (CVM_PERIODS, False),
        "DiskWriteIops": (CVM_PERIODS, False),
        "DiskReadTraffic": (CBS_TRAFFIC_PERIODS, False),
        "DiskWriteTraffic": (CBS_TRAFFIC_PERIODS, False),
        "DiskAwait": (CVM_PERIODS, False),
        "DiskSvctm": (CVM_PERIODS, False),
        "DiskUtil": (CVM_PERIODS, False),
    },
}
OBJECT_DIMENSION = {"QCE/CVM": "InstanceId", "QCE/BLOCK_STORAGE": "diskId"}
ACTIONS = {
    "GetMonitorData": ("monitor", "2018-07-24"),
    "DescribeBaseMetrics": ("monitor", "2018-07-24"),
    "DescribeInstances": ("cvm", "2017-03-12"),
    "DescribeDisks": ("cbs", "2017-03-12"),
    "DescribeZoneInstanceConfigInfos": ("cvm", "2017-03-12"),
    "DescribeProductEventList": ("monitor", "2018-07-24"),
}
#: Event names → (EventId, EventCName, EventEName) as the event centre spells them;
#: another name is answered with itself as its English name.
EVENT_NAMES = {
    "guest_reboot": (43, "机器重启", "GuestReboot"),
    "guest_core_error": (1, "内核故障", "GuestCoreError"),
    "guest_oom": (2, "内存oom", "GuestOom"),
    "ping_unreachable": (3, "ping不可达", "PingUnreachable"),
    "disk_readonly": (4, "磁盘只读", "DiskReadonly"),
    "nvme_error": (5, "子机nvme设备error", "NvmeError"),
    "instance_restarting": (6, "实例计划重启（宿主机系统维护）", "InstanceRestarting"),
    "instance_restarted": (7, "实例已重启（宿主机系统错误）", "InstanceRestarted"),
}
EVENT_LIST_FILTERS = ("ProductName", "EventName", "InstanceId", "Type", "Status")
#: The instance type of a fake instance unless a test names one (no GPUs, not priced).
DEFAULT_INSTANCE_TYPE = "S5.LARGE8"
PRICE_FILTERS = ("zone", "instance-family", "instance-type", "instance-charge-type")
MAX_SKEW_SECONDS = 300


class FakeClock:
    """A settable wall clock shared by the fake and the code under test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeInstance:
    instance_id: str
    region: str
    running: bool = True
    tags: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    instance_type: str = DEFAULT_INSTANCE_TYPE
    #: Empty: the region's first zone, ``<region>-1``.
    zone: str = ""

    @property
    def placement_zone(self) -> str:
        return self.zone or f"{self.region}-1"


@dataclass(frozen=True)
class FakeInstanceType:
    """An instance type sold in one zone, with its pay-as-you-go price."""

    zone: str
    instance_type: str
    #: Hourly list price (``UnitPrice``).
    unit_price: float
    #: Percent of the list price paid (``Discount``; 80.0 = 20 % off); None: the
    #: answer has no ``Discount``/``UnitPriceDiscount``.
    discount: float | None
    gpus: int
    #: ``GpuCount``; None: left out of the answer.
    gpu_count: float | None

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def items(self) -> list[dict[str, Any]]:
        """Its ``InstanceTypeQuotaItem`` per billing mode."""
        hourly: dict[str, Any] = {"UnitPrice": self.unit_price, "ChargeUnit": "HOUR"}
        monthly: dict[str, Any] = {"OriginalPrice": round(self.unit_price * 720 * 0.7, 2),
                                   "DiscountPrice": round(self.unit_price * 720 * 0.7, 2),
                                   "UnitPrice": 0.0}
        if self.discount is not None:
            hourly |= {"Discount": self.discount,
                       "UnitPriceDiscount": round(self.unit_price * self.discount / 100, 6)}
        common: dict[str, Any] = {
            "Zone": self.zone, "InstanceType": self.instance_type,
            "InstanceFamily": self.instance_type.split(".")[0], "TypeName": self.instance_type,
            "Cpu": 8, "Memory": 32, "Gpu": self.gpus, "Fpga": 0, "Status": "SELL",
            "StatusCategory": "EnoughStock", "NetworkCard": 0, "Externals": {},
        }
        if self.gpu_count is not None:
            common["GpuCount"] = self.gpu_count
        return [{**common, "InstanceChargeType": "POSTPAID_BY_HOUR", "Price": hourly},
                {**common, "InstanceChargeType": "PREPAID", "Price": monthly}]


@dataclass
class FakeDisk:
    disk_id: str
    region: str
    instance_id: str | None


@dataclass
class FakeEvent:
    """One event of the event centre (``recover()`` it through the fake)."""

    instance_id: str
    name: str
    #: StartTime, Unix seconds.
    start: int
    status: str = "alarm"  # alarm | recover | -
    event_type: str = "abnormal"  # abnormal | status_change
    #: UpdateTime, Unix seconds (the start until it changes).
    updated: int = 0
    chinese: str = ""
    english: str = ""

    def item(self, region: str) -> dict[str, Any]:
        """Its ``DescribeProductEventListEvents`` object."""
        event_id, chinese, english = EVENT_NAMES.get(self.name, (99, self.name, self.name))
        return {
            "EventId": event_id, "EventCName": self.chinese or chinese,
            "EventEName": self.english or english, "EventName": self.name,
            "ProductCName": "云服务器", "ProductEName": "Cloud Virtual Machine",
            "ProductName": "cvm", "InstanceId": self.instance_id,
            "InstanceName": f"name-{self.instance_id}", "ProjectId": 0, "Region": region,
            "Status": self.status, "SupportAlarm": 1, "Type": self.event_type,
            "StartTime": self.start, "UpdateTime": self.updated or self.start,
            "Dimensions": [{"Key": "deviceLanIp", "Name": "内网IP", "Value": "10.0.0.1"},
                           {"Key": "deviceWanIp", "Name": "外网IP", "Value": None}],
            "AdditionMsg": [], "IsAlarmConfig": 0, "GroupInfo": [],
        }


@dataclass(frozen=True)
class Record:
    """One request as the fake saw it."""

    action: str
    region: str | None
    code: str | None  # None: success
    params: Mapping[str, Any]
    arrived: float  # time.monotonic()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    body: bytes = field(default=b"", repr=False)


@dataclass
class _Fault:
    kind: str  # http500 | http502 | slow | malformed | error
    action: str | None
    remaining: int
    code: str = ""
    seconds: float = 0.0


class FakeTencentCloud(LoopbackHTTPServer):
    """The API server; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        rate_limit: float = 20.0,
        batch_limit: int = 10,
        ingest_lag: float = 60.0,
        seed: int = 1,
        event_page_limit: int = 100,
    ) -> None:
        self.clock = clock
        self.rate_limit = rate_limit
        self.batch_limit = batch_limit
        self.ingest_lag = ingest_lag
        self.event_page_limit = event_page_limit
        self.events: list[FakeEvent] = []
        #: Seconds the fake's clock runs ahead of ``clock`` (clock-skew tests).
        self.skew = 0.0
        self.random = random.Random(seed)
        self.accounts: dict[str, tuple[str, str | None]] = {}
        self.instances: list[FakeInstance] = []
        self.disks: list[FakeDisk] = []
        #: (zone, instance type) → what DescribeZoneInstanceConfigInfos answers.
        self.instance_types: dict[tuple[str, str], FakeInstanceType] = {}
        self._instance_index: dict[str, FakeInstance] = {}
        self._disk_index: dict[str, FakeDisk] = {}
        self.records: list[Record] = []
        self._arrivals: deque[float] = deque()
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        super().__init__(self._answer, clock=self.now)

    # -- set-up ------------------------------------------------------------------

    def add_account(self, secret_id: str, secret_key: str, token: str | None = None) -> None:
        with self._lock:
            self.accounts[secret_id] = (secret_key, token)

    def remove_account(self, secret_id: str) -> None:
        with self._lock:
            self.accounts.pop(secret_id, None)

    def add_fleet(
        self,
        region: str,
        count: int,
        *,
        disks_per_instance: int = 0,
        prefix: str = "ins",
        tags: Mapping[str, str] | None = None,
        gpus: int = 0,
        stopped: Iterable[int] = (),
        instance_type: str = DEFAULT_INSTANCE_TYPE,
        zone: str = "",
    ) -> list[FakeInstance]:
        """``count`` instances (``{prefix}-{region}-{i:05d}``) with their disks."""
        stopped_set = set(stopped)
        fleet = []
        for index in range(count):
            instance = FakeInstance(
                f"{prefix}-{region}-{index:05d}", region, index not in stopped_set,
                dict(tags or {}), gpus, instance_type, zone,
            )
            fleet.append(instance)
            self._instance_index[instance.instance_id] = instance
            for number in range(disks_per_instance):
                disk = FakeDisk(f"disk-{instance.instance_id}-{number}", region,
                                instance.instance_id)
                self.disks.append(disk)
                self._disk_index[disk.disk_id] = disk
        self.instances.extend(fleet)
        return fleet

    def set_price(
        self, zone: str, instance_type: str, unit_price: float, *, gpus: int = 0,
        discount: float | None = 100.0, gpu_count: float | None = None,
    ) -> None:
        """Sell ``instance_type`` in ``zone`` at ``unit_price`` an hour (``GpuCount``
        defaults to ``gpus``)."""
        with self._lock:
            self.instance_types[(zone, instance_type)] = FakeInstanceType(
                zone, instance_type, unit_price, discount, gpus,
                float(gpus) if gpu_count is None else gpu_count,
            )

    def add_event(
        self, instance_id: str, name: str, *, start: float, status: str = "alarm",
        event_type: str = "abnormal", chinese: str = "", english: str = "",
    ) -> FakeEvent:
        """An event of ``instance_id`` that started at ``start`` (Unix seconds)."""
        event = FakeEvent(instance_id, name, int(start), status, event_type, int(start),
                          chinese, english)
        with self._lock:
            self.events.append(event)
        return event

    def recover(self, event: FakeEvent, at: float) -> None:
        """The event recovered at ``at``: its status becomes ``recover``."""
        with self._lock:
            event.status, event.updated = "recover", int(at)

    def fail_next(
        self, kind: str, count: int = 1, *, action: str | None = None, code: str = "",
        seconds: float = 1.0,
    ) -> None:
        """Script a fault for the next ``count`` requests (of ``action``, if given)."""
        with self._lock:
            self._faults.append(_Fault(kind, action, count, code, seconds))

    # -- expectations ------------------------------------------------------------

    @staticmethod
    def value(metric: str, dimensions: Mapping[str, str], timestamp: float) -> float:
        """The value served for a series at a period start (deterministic)."""
        key = f"{metric}|{sorted(dimensions.items())}|{int(timestamp)}"
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:4], "big") % 100_000 / 1000.0

    def count(self, action: str | None = None, code: str | None = "any") -> int:
        """Requests seen (of ``action``; with ``code``: only those answered with it)."""
        with self._lock:
            return sum(
                1 for r in self.records
                if (action is None or r.action == action) and (code == "any" or r.code == code)
            )

    def codes(self) -> Counter[str | None]:
        with self._lock:
            return Counter(r.code for r in self.records)

    # -- request processing --------------------------------------------------------

    def handle(self, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes, float]:
        """(HTTP status, body, seconds to stall before answering) for one request."""
        arrived = time.monotonic()
        action = headers.get("x-tc-action", "")
        region = headers.get("x-tc-region")
        params: dict[str, Any] = {}
        fault = self._take_fault(action)
        if fault is not None and fault.kind in ("http500", "http502"):
            self._record(action, region, fault.kind.upper(), params, arrived, headers, body)
            status = int(fault.kind[4:])
            return status, b"<html><body>Bad Gateway</body></html>", 0.0
        try:
            params = json.loads(body or b"{}")
            self._authenticate(headers, body, action)
            self._throttle(arrived)
            if fault is not None and fault.kind == "error":
                raise _APIFailure(fault.code, "scripted failure")
            answer = self._dispatch(action, params, region)
        except _APIFailure as failure:
            self._record(action, region, failure.code, params, arrived, headers, body)
            return 200, _envelope({"Error": {"Code": failure.code, "Message": failure.message}}), 0.0
        except ValueError:
            self._record(action, region, "InvalidParameter", params, arrived, headers, body)
            return 200, _envelope({"Error": {"Code": "InvalidParameter",
                                             "Message": "body is not JSON"}}), 0.0
        self._record(action, region, None, params, arrived, headers, body)
        if fault is not None and fault.kind == "malformed":
            return 200, _envelope(answer)[:25], 0.0
        stall = fault.seconds if fault is not None and fault.kind == "slow" else 0.0
        return 200, _envelope(answer), stall

    def now(self) -> float:
        return self.clock() + self.skew

    def _answer(self, request: Request) -> Reply:
        status, body, stall = self.handle(request.headers, request.body)
        return Reply(status, body, "application/json", delay=stall)

    def _take_fault(self, action: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.action in (None, action):
                    fault.remaining -= 1
                    return fault
        return None

    def _record(self, action: str, region: str | None, code: str | None,
                params: Mapping[str, Any], arrived: float,
                headers: Mapping[str, str], body: bytes) -> None:
        with self._lock:
            self.records.append(Record(action, region, code, params, arrived, headers, body))

    def _authenticate(self, headers: Mapping[str, str], body: bytes, action: str) -> None:
        if action not in ACTIONS:
            raise _APIFailure("InvalidAction", f"unknown action {action!r}")
        service, version = ACTIONS[action]
        if headers.get("x-tc-version") != version:
            raise _APIFailure("InvalidParameterValue", f"{action} needs version {version}")
        authorization = headers.get("authorization", "")
        try:
            algorithm, rest = authorization.split(" ", 1)
            fields = dict(part.strip().split("=", 1) for part in rest.split(","))
            secret_id, date, scope_service, terminator = fields["Credential"].split("/")
            signed_headers = fields["SignedHeaders"]
            signature = fields["Signature"]
            timestamp = int(headers["x-tc-timestamp"])
        except (KeyError, ValueError):
            raise _APIFailure("AuthFailure.InvalidAuthorization", "malformed Authorization") from None
        if algorithm != "TC3-HMAC-SHA256" or terminator != "tc3_request":
            raise _APIFailure("AuthFailure.InvalidAuthorization", "unsupported algorithm")
        if abs(timestamp - self.now()) > MAX_SKEW_SECONDS:
            raise _APIFailure("AuthFailure.SignatureExpire",
                              "Signature expired. Timestamp is too far from the server time")
        with self._lock:
            account = self.accounts.get(secret_id)
        if account is None:
            raise _APIFailure("AuthFailure.SecretIdNotFound", "The SecretId is not found")
        secret_key, token = account
        utc = datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d")
        if date != utc or scope_service != service:
            raise _APIFailure("AuthFailure.SignatureFailure", "credential scope mismatch")
        names = signed_headers.split(";")
        canonical_headers = "".join(f"{n}:{headers.get(n, '').strip().lower()}\n" for n in names)
        canonical = "\n".join(["POST", "/", "", canonical_headers, signed_headers,
                               hashlib.sha256(body).hexdigest()])
        to_sign = "\n".join(["TC3-HMAC-SHA256", str(timestamp), f"{date}/{service}/tc3_request",
                             hashlib.sha256(canonical.encode()).hexdigest()])
        if "content-type" not in names or "host" not in names or signature != Sign.sign_tc3(
            secret_key, date, service, to_sign
        ):
            raise _APIFailure("AuthFailure.SignatureFailure",
                              "The provided credentials could not be validated")
        if token is not None and headers.get("x-tc-token") != token:
            raise _APIFailure("AuthFailure.TokenFailure", "token is missing or invalid")

    def _throttle(self, arrived: float) -> None:
        with self._lock:
            while self._arrivals and self._arrivals[0] <= arrived - 1.0:
                self._arrivals.popleft()
            if len(self._arrivals) >= self.rate_limit:
                raise _APIFailure("RequestLimitExceeded",
                                  "Your current request times equals to `20` in a second")
            self._arrivals.append(arrived)

    def _dispatch(self, action: str, params: Mapping[str, Any], region: str | None) -> dict[str, Any]:
        if action == "GetMonitorData":
            return self._get_monitor_data(params)
        if action == "DescribeBaseMetrics":
            return self._describe_base_metrics(params)
        if action == "DescribeInstances":
            return self._describe_instances(params, region)
        if action == "DescribeZoneInstanceConfigInfos":
            return self._describe_zone_instance_config_infos(params, region)
        if action == "DescribeProductEventList":
            return self._describe_product_event_list(params)
        return self._page(params, "DiskSet", [
            {"DiskId": d.disk_id, "InstanceId": d.instance_id or "",
             "Attached": d.instance_id is not None}
            for d in self.disks if d.region == region
        ])

    def _describe_instances(self, params: Mapping[str, Any], region: str | None) -> dict[str, Any]:
        ids = params.get("InstanceIds")
        if ids is not None and params.get("Filters"):
            raise _APIFailure("InvalidParameter",
                              "InstanceIds and Filters cannot be specified at the same time")
        if ids is not None and len(ids) > 100:
            raise _APIFailure("InvalidParameterValue.LimitExceeded", "at most 100 InstanceIds")
        return self._page(params, "InstanceSet", [
            {"InstanceId": i.instance_id,
             "InstanceState": "RUNNING" if i.running else "STOPPED",
             "InstanceType": i.instance_type,
             "Placement": {"Zone": i.placement_zone, "ProjectId": 0},
             "Tags": [{"Key": k, "Value": v} for k, v in i.tags.items()]}
            for i in self.instances
            if i.region == region and (i.instance_id in ids if ids is not None
                                       else _tags_match(i, params))
        ])

    def _describe_zone_instance_config_infos(
        self, params: Mapping[str, Any], region: str | None
    ) -> dict[str, Any]:
        filters = params.get("Filters") or []
        if len(filters) > 10:
            raise _APIFailure("InvalidParameterValue", "at most 10 Filters")
        wanted: dict[str, set[str]] = {}
        for item in filters:
            name, values = item.get("Name"), item.get("Values") or []
            if name not in PRICE_FILTERS:
                raise _APIFailure("InvalidFilter", f"unknown filter {name!r}")
            if len(values) > 100:
                raise _APIFailure("InvalidParameterValue", "at most 100 Filter.Values")
            wanted[name] = set(values)
        with self._lock:
            types = list(self.instance_types.values())
        answer = []
        for fake in types:
            if fake.region != region:
                continue
            for item in fake.items():
                fields = {"zone": item["Zone"], "instance-family": item["InstanceFamily"],
                          "instance-type": item["InstanceType"],
                          "instance-charge-type": item["InstanceChargeType"]}
                if all(fields[name] in values for name, values in wanted.items()):
                    answer.append(item)
        self.random.shuffle(answer)
        return {"InstanceTypeQuotaSet": answer}

    def _describe_product_event_list(self, params: Mapping[str, Any]) -> dict[str, Any]:
        if "Module" not in params:
            raise _APIFailure("MissingParameter", "the request is missing Module")
        if params["Module"] != "monitor":
            raise _APIFailure("InvalidParameterValue", "Module must be monitor")
        wanted: dict[str, set[str]] = {}
        for name in EVENT_LIST_FILTERS:
            values = params.get(name)
            if values is None:
                continue
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise _APIFailure("InvalidParameter", f"{name} must be a list of strings")
            wanted[name] = set(values)
        offset, limit = params.get("Offset", 0), params.get("Limit", 20)
        for name, value in (("Offset", offset), ("Limit", limit),
                            ("StartTime", params.get("StartTime", 0)),
                            ("EndTime", params.get("EndTime", 0))):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _APIFailure("InvalidParameter", f"{name} must be a non-negative integer")
        if not 1 <= limit <= self.event_page_limit:
            raise _APIFailure("InvalidParameterValue",
                              f"Limit must be 1-{self.event_page_limit}")
        now = int(self.now())
        start, end = params.get("StartTime", now - 86400), params.get("EndTime", now)
        order = params.get("TimeOrder", "DESC")
        if order not in ("ASC", "DESC"):
            raise _APIFailure("InvalidParameterValue", "TimeOrder must be ASC or DESC")
        with self._lock:
            events = list(self.events)
        matched = []
        for event in events:
            fields = {"ProductName": "cvm", "EventName": event.name,
                      "InstanceId": event.instance_id, "Type": event.event_type,
                      "Status": event.status}
            if start <= event.start <= end and all(
                fields[name] in values for name, values in wanted.items()
            ):
                matched.append(event)
        matched.sort(key=lambda e: (e.updated or e.start, e.start), reverse=order == "DESC")
        regions = {i.instance_id: i.region for i in self.instances}
        return {
            "Events": [e.item(_short_region(regions.get(e.instance_id, "")))
                       for e in matched[offset : offset + limit]],
            "OverView": {
                "StatusChangeAmount": sum(e.event_type == "status_change" for e in matched),
                "UnConfigAlarmAmount": len(matched),
                "UnNormalEventAmount": sum(e.event_type == "abnormal" for e in matched),
                "UnRecoverAmount": sum(e.status == "alarm" for e in matched),
            },
            "Total": len(matched),
        }

    def _describe_base_metrics(self, params: Mapping[str, Any]) -> dict[str, Any]:
        namespace = params.get("Namespace")
        if namespace not in METRICS:
            raise _APIFailure("InvalidParameterValue", f"unknown namespace {namespace!r}")
        return {"MetricSet": [
            {"Namespace": namespace, "MetricName": name, "Period": periods, "Unit": "",
             "Dimensions": [{"Dimensions": [OBJECT_DIMENSION[namespace]]}]}
            for name, (periods, _) in METRICS[namespace].items()
        ]}

    def _page(self, params: Mapping[str, Any], key: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        offset, limit = int(params.get("Offset", 0)), int(params.get("Limit", 20))
        if not 1 <= limit <= 100:
            raise _APIFailure("InvalidParameterValue.LimitExceeded", "Limit must be 1-100")
        return {"TotalCount": len(items), key: items[offset : offset + limit]}

    def _get_monitor_data(self, params: Mapping[str, Any]) -> dict[str, Any]:
        namespace, metric = params.get("Namespace"), params.get("MetricName")
        if namespace not in METRICS or metric not in METRICS[namespace]:
            raise _APIFailure("InvalidParameterValue",
                              f"metric {namespace}/{metric} does not exist")
        periods, per_gpu = METRICS[namespace][metric]
        period = int(params.get("Period", 300))
        if period not in periods:
            raise _APIFailure("InvalidParameterValue", f"period {period} not supported")
        requested = params.get("Instances") or []
        if len(requested) > self.batch_limit:
            raise _APIFailure("InvalidParameterValue",
                              f"at most {self.batch_limit} instances per request")
        start = datetime.fromisoformat(params["StartTime"]).timestamp()
        end = datetime.fromisoformat(params["EndTime"]).timestamp()
        complete = self.now() - self.ingest_lag - period  # last period start with full data
        stamps = [t for t in range(int(-(-start // period)) * period, int(end) + 1, period)
                  if t <= complete]
        if len(stamps) * len(requested) > 1440:
            raise _APIFailure("InvalidParameterValue", "more than 1440 data points")
        points = []
        for item in requested:
            dims = {d["Name"]: d["Value"] for d in item.get("Dimensions", [])}
            for series in self._series(namespace, dims, per_gpu):
                running = self._running(namespace, dims)
                values = [self.value(metric, series, t) for t in stamps] if running else []
                dimension_list = [{"Name": k, "Value": v} for k, v in series.items()]
                self.random.shuffle(dimension_list)
                points.append({"Dimensions": dimension_list,
                               "Timestamps": stamps if running else [], "Values": values})
        self.random.shuffle(points)
        return {"Period": period, "MetricName": metric, "DataPoints": points,
                "StartTime": params["StartTime"], "EndTime": params["EndTime"], "Msg": ""}

    def _series(self, namespace: str, dims: Mapping[str, str], per_gpu: bool) -> list[dict[str, str]]:
        instance = self._instance(dims.get("InstanceId")) if namespace == "QCE/CVM" else None
        if per_gpu and instance is not None and instance.gpus:
            return [{**dims, "minorNumber": str(gpu)} for gpu in range(instance.gpus)]
        return [dict(dims)]

    def _running(self, namespace: str, dims: Mapping[str, str]) -> bool:
        if namespace == "QCE/CVM":
            instance = self._instance(dims.get("InstanceId"))
        else:
            disk = self._disk_index.get(dims.get("diskId", ""))
            instance = self._instance(disk.instance_id) if disk else None
        return instance is not None and instance.running

    def _instance(self, instance_id: str | None) -> FakeInstance | None:
        return self._instance_index.get(instance_id or "")


class _APIFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code)
        self.code = code
        self.message = message


def _envelope(response: Mapping[str, Any]) -> bytes:
    return json.dumps({"Response": {**response, "RequestId": str(uuid.uuid4())}}).encode()


def _short_region(region: str) -> str:
    """The event centre names regions by short codes (``gz``, ``sh``) as in its example."""
    return {"ap-guangzhou": "gz", "ap-shanghai": "sh", "ap-beijing": "bj"}.get(region, region)


def _tags_match(instance: FakeInstance, params: Mapping[str, Any]) -> bool:
    for item in params.get("Filters", []):
        name, values = item.get("Name", ""), item.get("Values", [])
        if name == "tag-key" and not any(v in instance.tags for v in values):
            return False
        if name.startswith("tag:") and instance.tags.get(name[4:]) not in values:
            return False
    return True
