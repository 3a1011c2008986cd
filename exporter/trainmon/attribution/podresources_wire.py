"""The wire format of the kubelet's pod-resources API: its messages and a proto3 codec.

The messages of ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` that
``trainmon.attribution.podresources`` reads, as frozen dataclasses, and a small
proto3 wire codec for them: varints (``int64`` as two's complement, repeated ones
packed or not), length-delimited fields (strings, bytes, nested messages) and the
fixed-width types, which are skipped like every unknown field (``memory`` among
them). No ``protobuf`` package is needed.

``Decoder`` reads a response within ``PodResourcesLimits`` (docs/security.md):
what is past the pods, containers-per-pod or devices-per-container limits is
dropped and counted in ``Decoder.dropped``; bytes that are no message, a string
that is not UTF-8 or longer than ``max_string_length`` raise ``WireError``. The
encoders write the same messages (for testkit.fake_kubelet and tests).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: ``limit`` of ``trainmon_pod_resources_dropped_total``.
LIMITS = ("pods", "containers", "devices")


class WireError(ValueError):
    """Bytes that are not the message they should be."""


@dataclass(frozen=True)
class PodResourcesLimits:
    """Bounds on one answer of the kubelet (docs/security.md)."""

    #: Longest response accepted, bytes (gRPC refuses a longer one: ``too_large``).
    max_response_bytes: int = 4 * 1024 * 1024
    #: Pods kept from one ``List`` (110 is the kubelet's default ``maxPods``).
    max_pods: int = 512
    containers_per_pod: int = 64
    #: Device ids and DRA claim devices kept per container.
    devices_per_container: int = 256
    #: Longest string field; a longer one makes the answer ``invalid``.
    max_string_length: int = 1024


# -- the messages ------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]
    #: NUMA node ids of the devices' topology.
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClaimResource:
    cdi_devices: tuple[str, ...]
    driver_name: str
    pool_name: str
    device_name: str


@dataclass(frozen=True)
class DynamicResource:
    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True)
class AllocatableResources:
    devices: tuple[ContainerDevices, ...] = ()
    cpu_ids: tuple[int, ...] = ()


# -- the wire codec ----------------------------------------------------------------

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _int64(value: int) -> int:
    """A varint read as proto3 ``int64`` (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message: an int for
    varints and fixed-width fields, the bytes of a length-delimited one."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
            yield number, wire_type, value
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            if pos + width > end:
                raise WireError("truncated fixed-width field")
            yield number, wire_type, int.from_bytes(data[pos:pos + width], "little")
            pos += width
        elif wire_type == _BYTES:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise WireError("length-delimited field past the end of its message")
            yield number, wire_type, data[pos:pos + length]
            pos += length
        else:
            raise WireError(f"unsupported wire type {wire_type}")


def encode_varint(value: int) -> bytes:
    """A non-negative int (or an int64 as two's complement) as a varint."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | _BYTES) + encode_varint(len(payload)) + payload


def _string_field(number: int, text: str) -> bytes:
    return _bytes_field(number, text.encode()) if text else b""


def _packed_int64(number: int, values: Sequence[int]) -> bytes:
    return _bytes_field(number, b"".join(map(encode_varint, values))) if values else b""


def encode_devices(devices: ContainerDevices) -> bytes:
    topology = b"".join(_bytes_field(1, encode_varint(1 << 3) + encode_varint(node))
                        for node in devices.numa_nodes)
    return (_string_field(1, devices.resource_name)
            + b"".join(_bytes_field(2, device.encode()) for device in devices.device_ids)
            + (_bytes_field(3, topology) if topology else b""))


def encode_list_response(pods: Sequence[PodResources]) -> bytes:
    """A ``ListPodResourcesResponse`` (for testkit.fake_kubelet and tests)."""
    return b"".join(_bytes_field(1, _encode_pod(pod)) for pod in pods)


def encode_allocatable_response(resources: AllocatableResources) -> bytes:
    """An ``AllocatableResourcesResponse``."""
    return (b"".join(_bytes_field(1, encode_devices(d)) for d in resources.devices)
            + _packed_int64(2, resources.cpu_ids))


def _encode_pod(pod: PodResources) -> bytes:
    return (_string_field(1, pod.name) + _string_field(2, pod.namespace)
            + b"".join(_bytes_field(3, _encode_container(c)) for c in pod.containers))


def _encode_container(container: ContainerResources) -> bytes:
    return (_string_field(1, container.name)
            + b"".join(_bytes_field(2, encode_devices(d)) for d in container.devices)
            + _packed_int64(3, container.cpu_ids)
            + b"".join(_bytes_field(5, _encode_dynamic(d))
                       for d in container.dynamic_resources))


def _encode_dynamic(resource: DynamicResource) -> bytes:
    claims = b"".join(_bytes_field(4, _string_field(2, claim.driver_name)
                                   + _string_field(3, claim.pool_name)
                                   + _string_field(4, claim.device_name)
                                   + b"".join(_bytes_field(1, _string_field(1, name))
                                              for name in claim.cdi_devices))
                      for claim in resource.claim_resources)
    return _string_field(2, resource.claim_name) + _string_field(3, resource.claim_namespace) \
        + claims


class Decoder:
    """Decodes the API's responses within ``limits``; ``dropped`` counts what a limit cut
    (by ``LIMITS`` name), over every response it decoded."""

    def __init__(self, limits: PodResourcesLimits | None = None) -> None:
        self.limits = limits or PodResourcesLimits()
        self.dropped: Counter[str] = Counter()

    def list_response(self, data: bytes) -> tuple[PodResources, ...]:
        """The pods of a ``ListPodResourcesResponse``; raises ``WireError``."""
        pods: list[PodResources] = []
        for number, wire_type, value in fields(data):
            if number == 1:
                if len(pods) >= self.limits.max_pods:
                    self.dropped["pods"] += 1
                    continue
                pods.append(self._pod(self._message(wire_type, value)))
        return tuple(pods)

    def allocatable_response(self, data: bytes) -> AllocatableResources:
        """An ``AllocatableResourcesResponse``; raises ``WireError``."""
        devices: list[ContainerDevices] = []
        cpus: list[int] = []
        budget = [self.limits.devices_per_container * self.limits.max_pods]
        for number, wire_type, value in fields(data):
            if number == 1:
                devices.append(self._devices(self._message(wire_type, value), budget))
            elif number == 2:
                cpus.extend(self._int64s(wire_type, value))
        return AllocatableResources(tuple(devices), tuple(cpus))

    def _pod(self, data: bytes) -> PodResources:
        name = namespace = ""
        containers: list[ContainerResources] = []
        for number, wire_type, value in fields(data):
            if number == 1:
                name = self._string(wire_type, value)
            elif number == 2:
                namespace = self._string(wire_type, value)
            elif number == 3:
                if len(containers) >= self.limits.containers_per_pod:
                    self.dropped["containers"] += 1
                    continue
                containers.append(self._container(self._message(wire_type, value)))
        return PodResources(name, namespace, tuple(containers))

    def _container(self, data: bytes) -> ContainerResources:
        name = ""
        devices: list[ContainerDevices] = []
        cpus: list[int] = []
        dynamic: list[DynamicResource] = []
        budget = [self.limits.devices_per_container]
        for number, wire_type, value in fields(data):
            if number == 1:
                name = self._string(wire_type, value)
            elif number == 2:
                devices.append(self._devices(self._message(wire_type, value), budget))
            elif number == 3:
                cpus.extend(self._int64s(wire_type, value))
            elif number == 5:
                dynamic.append(self._dynamic(self._message(wire_type, value), budget))
        return ContainerResources(name, tuple(devices), tuple(cpus), tuple(dynamic))

    def _devices(self, data: bytes, budget: list[int]) -> ContainerDevices:
        resource = ""
        ids: list[str] = []
        nodes: list[int] = []
        for number, wire_type, value in fields(data):
            if number == 1:
                resource = self._string(wire_type, value)
            elif number == 2:
                device = self._string(wire_type, value)
                if budget[0] <= 0:
                    self.dropped["devices"] += 1
                    continue
                budget[0] -= 1
                ids.append(device)
            elif number == 3:
                for node_number, node_type, node in fields(self._message(wire_type, value)):
                    if node_number == 1 and len(nodes) < self.limits.devices_per_container:
                        nodes.extend(self._numa_ids(self._message(node_type, node)))
        return ContainerDevices(resource, tuple(ids), tuple(nodes))

    def _numa_ids(self, data: bytes) -> list[int]:
        return [value for number, wire_type, value in fields(data)
                if number == 1 and wire_type == _VARINT and isinstance(value, int)]

    def _dynamic(self, data: bytes, budget: list[int]) -> DynamicResource:
        claim = namespace = ""
        resources: list[ClaimResource] = []
        for number, wire_type, value in fields(data):
            if number == 2:
                claim = self._string(wire_type, value)
            elif number == 3:
                namespace = self._string(wire_type, value)
            elif number == 4:
                resource = self._claim(self._message(wire_type, value))
                if budget[0] <= 0:
                    self.dropped["devices"] += 1
                    continue
                budget[0] -= 1
                resources.append(resource)
        return DynamicResource(claim, namespace, tuple(resources))

    def _claim(self, data: bytes) -> ClaimResource:
        cdi: list[str] = []
        strings = {2: "", 3: "", 4: ""}
        for number, wire_type, value in fields(data):
            if number == 1:
                names = [self._string(t, v) for n, t, v in fields(self._message(wire_type, value))
                         if n == 1]
                if len(cdi) < self.limits.devices_per_container:
                    cdi.extend(names[:1])
            elif number in strings:
                strings[number] = self._string(wire_type, value)
        return ClaimResource(tuple(cdi), strings[2], strings[3], strings[4])

    def _message(self, wire_type: int, value: int | bytes) -> bytes:
        if wire_type != _BYTES or not isinstance(value, bytes):
            raise WireError("a message field that is not length-delimited")
        return value

    def _string(self, wire_type: int, value: int | bytes) -> str:
        data = self._message(wire_type, value)
        if len(data) > self.limits.max_string_length:
            raise WireError(f"a string of {len(data)} bytes "
                            f"(at most {self.limits.max_string_length})")
        try:
            return data.decode()
        except UnicodeDecodeError as error:
            raise WireError("a string that is not UTF-8") from error

    def _int64s(self, wire_type: int, value: int | bytes) -> list[int]:
        if wire_type == _VARINT and isinstance(value, int):
            return [_int64(value)]
        data = self._message(wire_type, value)
        values, pos = [], 0
        while pos < len(data):
            number, pos = _read_varint(data, pos)
            values.append(_int64(number))
        return values
