"""Which CVM instances and CBS disks to pull, per region.

Instances come from the configuration (``instances``) or, when none are
listed, from CVM ``DescribeInstances`` filtered by tags (``discovery_tags``:
``{key: value}`` → filter ``tag:<key>``; an empty value → filter ``tag-key``),
paged 100 at a time. Disks come from the configuration (``disks``, a map of
instance → disk IDs) or, when ``discover_disks`` is on and none are listed,
from CBS ``DescribeDisks``: every page of the region's disks, kept when they
are attached to one of the instances (no assumption about how many values an
``instance-id`` filter accepts). Stopped instances stay targets: Cloud Monitor
then answers with empty data, which the puller turns into no sample.

Discovery also keeps each instance's ``Placement.Zone`` and ``InstanceType``
(``placements``), which the price lookups need (``pricing``); for configured
``instances`` they come from ``describe_placements``: ``DescribeInstances`` by
``InstanceIds``, at most 100 per call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from trainmon.tencent.catalogue import TargetKind
from trainmon.tencent.client import CBS, CVM, APIError, Service, TencentAPI

log = logging.getLogger(__name__)

#: Largest ``Limit`` DescribeInstances and DescribeDisks accept.
PAGE_SIZE = 100


@dataclass(frozen=True)
class Target:
    """One monitored object: an instance or a disk, in one region."""

    kind: TargetKind
    region: str
    object_id: str
    #: The instance a disk is attached to, when known (exported as a label).
    instance_id: str | None = None

    @property
    def dimensions(self) -> dict[str, str]:
        """The request dimensions that select this object in GetMonitorData."""
        return {self.kind.dimension: self.object_id}


@dataclass(frozen=True)
class Placement:
    """Where an instance runs and what it is, from ``DescribeInstances``."""

    #: ``Placement.Zone``, e.g. ``ap-shanghai-5``.
    zone: str
    #: ``InstanceType``, e.g. ``GN10Xp.20XLARGE320``.
    instance_type: str


@dataclass(frozen=True)
class RegionTargets:
    region: str
    instances: tuple[Target, ...]
    disks: tuple[Target, ...]
    #: instance ID → its placement, for the discovered instances that named one.
    placements: Mapping[str, Placement] = field(default_factory=dict)

    def of_kind(self, kind: TargetKind) -> tuple[Target, ...]:
        return self.instances if kind is TargetKind.INSTANCE else self.disks


class TargetSource:
    """Resolves the targets of one region from config or discovery."""

    def __init__(
        self,
        api: TencentAPI,
        *,
        instances: tuple[str, ...] = (),
        disks: Mapping[str, tuple[str, ...]] | None = None,
        tags: Mapping[str, str] | None = None,
        discover_disks: bool = True,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self._api = api
        self._instances = instances
        self._disks = dict(disks or {})
        self._tags = dict(tags or {})
        self._discover_disks = discover_disks
        self._page_size = page_size

    @property
    def discovers(self) -> bool:
        """Whether resolving calls the API (so it is worth repeating)."""
        return not self._instances or (self._discover_disks and not self._disks)

    def resolve(self, region: str) -> RegionTargets:
        """The current targets of ``region``; raises APIError when discovery fails."""
        placements: dict[str, Placement] = {}
        if self._instances:
            instance_ids = self._instances
        else:
            discovered = dict(self._discover_instances(region))
            instance_ids = tuple(discovered)
            placements = {i: p for i, p in discovered.items() if p is not None}
        instances = tuple(Target(TargetKind.INSTANCE, region, i) for i in instance_ids)
        if self._disks:
            disks = tuple(
                Target(TargetKind.DISK, region, disk, instance)
                for instance, disk_ids in self._disks.items()
                for disk in disk_ids
            )
        elif self._discover_disks and instance_ids:
            disks = self._disks_of(region, set(instance_ids))
        else:
            disks = ()
        log.debug("region %s: %d instances, %d disks", region, len(instances), len(disks))
        return RegionTargets(region, instances, disks, placements)

    def describe_placements(self, region: str, instance_ids: Sequence[str]) -> dict[str, Placement]:
        """Zone and type of ``instance_ids`` (``DescribeInstances`` by ``InstanceIds``,
        ``page_size`` per call); an instance the answer leaves out is missing.
        Raises APIError."""
        found: dict[str, Placement] = {}
        for index in range(0, len(instance_ids), self._page_size):
            chunk = list(instance_ids[index : index + self._page_size])
            params: dict[str, object] = {"InstanceIds": chunk, "Offset": 0, "Limit": len(chunk)}
            answer = self._api.call(CVM, "DescribeInstances", params, region)
            items = answer.get("InstanceSet")
            if not isinstance(items, list):
                raise APIError("DescribeInstances", "MalformedResponse",
                               "no InstanceSet in the answer")
            for item in items:
                if not isinstance(item, dict):
                    continue
                instance_id, placement = item.get("InstanceId"), _placement(item)
                if isinstance(instance_id, str) and instance_id in chunk and placement is not None:
                    found[instance_id] = placement
        return found

    def _discover_instances(self, region: str) -> Iterator[tuple[str, Placement | None]]:
        filters: list[dict[str, object]] = [
            {"Name": f"tag:{key}", "Values": [value]} if value else
            {"Name": "tag-key", "Values": [key]}
            for key, value in sorted(self._tags.items())
        ]
        for item in self._pages(CVM, "DescribeInstances", "InstanceSet", region, filters):
            instance_id = item.get("InstanceId")
            if isinstance(instance_id, str) and instance_id:
                yield instance_id, _placement(item)

    def _disks_of(self, region: str, instances: set[str]) -> tuple[Target, ...]:
        """Disks attached to ``instances``; none (logged) when DescribeDisks is refused.

        A policy without ``cbs:DescribeDisks`` must not stop the CVM metrics;
        authentication failures still propagate (nothing else would work).
        """
        try:
            return tuple(
                Target(TargetKind.DISK, region, disk, instance)
                for disk, instance in self._discover_disks_of(region)
                if instance in instances
            )
        except APIError as error:
            if error.is_auth_failure:
                raise
            log.warning("region %s: no disk discovery (%s); CBS metrics skipped", region, error)
            return ()

    def _discover_disks_of(self, region: str) -> Iterator[tuple[str, str]]:
        for item in self._pages(CBS, "DescribeDisks", "DiskSet", region, []):
            disk_id, instance_id = item.get("DiskId"), item.get("InstanceId")
            if isinstance(disk_id, str) and isinstance(instance_id, str) and instance_id:
                yield disk_id, instance_id

    def _pages(
        self,
        service: Service,
        action: str,
        key: str,
        region: str,
        filters: list[dict[str, object]],
    ) -> Iterator[Mapping[str, object]]:
        offset = 0
        while True:
            params: dict[str, object] = {"Offset": offset, "Limit": self._page_size}
            if filters:
                params["Filters"] = filters
            answer = self._api.call(service, action, params, region)
            items = answer.get(key)
            total = answer.get("TotalCount")
            if not isinstance(items, list) or not isinstance(total, int):
                raise APIError(action, "MalformedResponse", f"no {key}/TotalCount in the answer")
            yield from (item for item in items if isinstance(item, dict))
            offset += len(items)
            if not items or offset >= total:
                return


def _placement(item: Mapping[str, object]) -> Placement | None:
    """``Placement.Zone`` and ``InstanceType`` of a ``DescribeInstances`` item, if it has both."""
    placement = item.get("Placement")
    zone = placement.get("Zone") if isinstance(placement, dict) else None
    instance_type = item.get("InstanceType")
    if isinstance(zone, str) and zone and isinstance(instance_type, str) and instance_type:
        return Placement(zone, instance_type)
    return None
