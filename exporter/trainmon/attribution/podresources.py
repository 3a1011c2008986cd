"""The kubelet's pod-resources API: which GPUs each container was allocated.

Source: the kubelet's ``v1.PodResourcesLister`` gRPC service on its unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``), as published in
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``:

- ``List`` → ``ListPodResourcesResponse{pod_resources=1: PodResources}``, with
  ``PodResources{name=1, namespace=2, containers=3: ContainerResources}`` and
  ``ContainerResources{name=1, devices=2: ContainerDevices, cpu_ids=3,
  memory=4, dynamic_resources=5: DynamicResource}``;
  ``ContainerDevices{resource_name=1, device_ids=2, topology=3: TopologyInfo{nodes=1:
  NUMANode{ID=1}}}``; ``DynamicResource{claim_name=2, claim_namespace=3,
  claim_resources=4: ClaimResource{cdi_devices=1: CDIDevice{name=1}, driver_name=2,
  pool_name=3, device_name=4}}`` (DRA, Kubernetes 1.27+ behind
  ``KubeletPodResourcesDynamicResources``, on by default from 1.34);
- ``GetAllocatableResources`` → ``AllocatableResourcesResponse{devices=1:
  ContainerDevices, cpu_ids=2, memory=3}``.

The messages are decoded here by a small proto3 wire codec (varints and
length-delimited fields; unknown fields, ``memory`` among them, are skipped),
so no ``protobuf`` package is needed. ``grpcio`` carries the calls and is
imported on the first call only: a node without the socket never loads it
(the daemon's RSS budget, tests/test_footprint.py).

Everything read is bounded (docs/security.md): the response size
(``max_response_bytes``, enforced by gRPC before decoding), pods, containers per
pod and devices per container (``PodResourcesLimits``; what is past a limit is
dropped and counted), string length, and each call's deadline. The kubelet is
polled from a background thread (``PodResourcesPoller``), never on the scrape
path: a kubelet that is down, slow or answers garbage leaves the scrape as it is;
the poller's ``error`` says why, and its last good answer is dropped once older
than ``STALE_POLLS`` intervals.

``gpu_allocations`` maps the allocated devices to the GPUs the GPU collector
exports (docs/deploy.md, "GPU allocations"): device-plugin ids as UUIDs
(``GPU-…``, ``MIG-…``, time-slicing replicas ``GPU-…::<n>``) or indices
(``0``, MIG ``0:1``); DRA devices by the UUID or index their CDI device names
carry, else by the NVIDIA DRA driver's device names (``gpu-<index>``,
``gpu-<index>-mig-…``). A DRA device of another naming needs the driver's
ResourceSlice, which trainmon does not read: it is counted as unmapped.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainmon.background import BackgroundThread

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Where the kubelet serves the API (``--pod-resources-socket`` is not configurable).
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
ALLOCATABLE_METHOD = "/v1.PodResourcesLister/GetAllocatableResources"
#: Polls after which the last good answer of a kubelet that stopped answering is dropped.
STALE_POLLS = 3
#: Device-plugin resources that are whole GPUs (time-slicing may rename them ``.shared``).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
#: Prefix of the device plugin's MIG resources (``nvidia.com/mig-1g.10gb``).
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
#: The NVIDIA DRA driver's name (``DeviceClass`` ``gpu.nvidia.com``).
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"

#: ``result`` of ``trainmon_pod_resources_requests_total``.
RESULTS = ("ok", "timeout", "unavailable", "too_large", "invalid", "unimplemented", "error",
           "no_grpc")
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
    """A ``ListPodResourcesResponse`` (for fake kubelets and tests)."""
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


# -- the client ----------------------------------------------------------------------


class PodResourcesError(Exception):
    """A call that brought no answer; ``result`` is its ``RESULTS`` name."""

    def __init__(self, result: str, message: str) -> None:
        super().__init__(message)
        self.result = result


#: gRPC status code names → ``RESULTS``.
_STATUS_RESULTS = {"DEADLINE_EXCEEDED": "timeout", "UNAVAILABLE": "unavailable",
                   "RESOURCE_EXHAUSTED": "too_large", "UNIMPLEMENTED": "unimplemented"}


def _same(data: bytes) -> bytes:
    return data


class PodResourcesClient:
    """Unary calls of ``v1.PodResourcesLister`` over ``socket``, each within
    ``deadline_seconds``, answers of at most ``max_response_bytes``; returns raw bytes.

    ``grpcio`` is imported on the first call. After a failed call the channel is
    closed, so the next one connects afresh (a restarted kubelet, a new socket)."""

    def __init__(self, socket: Path, *, deadline_seconds: float = 2.0,
                 max_response_bytes: int = PodResourcesLimits.max_response_bytes) -> None:
        self.socket = socket
        self._deadline = deadline_seconds
        self._max_bytes = max_response_bytes
        self._grpc: Any = None
        self._channel: Any = None

    def call(self, method: str) -> bytes:
        """The response to ``method`` (``LIST_METHOD``, ``ALLOCATABLE_METHOD``) with an
        empty request; raises ``PodResourcesError``."""
        if self._grpc is None:
            try:
                self._grpc = importlib.import_module("grpc")
            except ImportError as error:
                raise PodResourcesError(
                    "no_grpc", f"grpcio is not installed ({error}): "
                    "pip install 'trainmon[kubernetes]'") from error
        grpc = self._grpc
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=[
                ("grpc.max_receive_message_length", self._max_bytes),
                ("grpc.max_send_message_length", 1024),
                ("grpc.enable_http_proxy", 0),
                ("grpc.enable_retries", 0),
            ])
        stub = self._channel.unary_unary(method, request_serializer=_same,
                                         response_deserializer=_same)
        try:
            answer: bytes = stub(b"", timeout=self._deadline)
        except grpc.RpcError as error:
            self.close()
            code = error.code() if callable(getattr(error, "code", None)) else None
            name = getattr(code, "name", "UNKNOWN")
            details = error.details() if callable(getattr(error, "details", None)) else ""
            raise PodResourcesError(_STATUS_RESULTS.get(name, "error"),
                                    f"{method}: {name} {details}".strip()) from error
        return answer

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


# -- the poller ----------------------------------------------------------------------


@dataclass(frozen=True)
class PodResourcesState:
    """What the poller knows now."""

    pods: tuple[PodResources, ...] = ()
    allocatable: AllocatableResources | None = None
    #: Why the latest poll failed; None after a good one.
    error: str | None = None
    #: Polls made so far (good or not).
    polls: int = 0
    #: A good answer is held (the latest, or one not older than ``STALE_POLLS`` polls).
    answered: bool = False


class PodResourcesPoller:
    """Calls ``List`` and ``GetAllocatableResources`` every ``interval_seconds`` from its
    own thread; ``state()`` and the counters are read without waiting on the kubelet."""

    def __init__(self, client: PodResourcesClient, *, interval_seconds: float = 10.0,
                 limits: PodResourcesLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._interval = interval_seconds
        self._limits = limits or PodResourcesLimits()
        self._dropped: Counter[str] = Counter()
        self._clock = clock
        self._thread = BackgroundThread("pod-resources", self._loop)
        self._changed = threading.Condition()
        self._state = PodResourcesState()
        self._good_at = float("-inf")
        self._requests: Counter[tuple[str, str]] = Counter()
        self._logged: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop(timeout=self._interval + 5.0)
        self.client.close()

    def state(self) -> PodResourcesState:
        with self._changed:
            return self._state

    def requests(self) -> dict[tuple[str, str], int]:
        """(call, result) → calls made."""
        with self._changed:
            return dict(self._requests)

    def dropped(self) -> dict[str, int]:
        """``LIMITS`` name → items dropped past it."""
        with self._changed:
            return {limit: self._dropped[limit] for limit in LIMITS}

    def wait_for_polls(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` polls are done; False when ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._state.polls >= count, timeout)

    def poll(self) -> None:
        """One poll: both calls, then the new state (on the calling thread)."""
        pods = allocatable = None
        error = None
        try:
            pods = self._fetch("list", LIST_METHOD, Decoder.list_response)
            try:
                allocatable = self._fetch("allocatable", ALLOCATABLE_METHOD,
                                          Decoder.allocatable_response)
            except PodResourcesError as problem:
                if problem.result != "unimplemented":  # a kubelet before 1.21
                    raise
        except PodResourcesError as problem:
            error = f"pod-resources API at {self.client.socket}: {problem}"
        now = self._clock()
        with self._changed:
            previous = self._state
            if pods is not None:
                self._good_at = now
                self._state = PodResourcesState(pods, allocatable, None, previous.polls + 1, True)
            elif now - self._good_at <= STALE_POLLS * self._interval:
                self._state = PodResourcesState(previous.pods, previous.allocatable, error,
                                                previous.polls + 1, previous.answered)
            else:
                self._state = PodResourcesState((), None, error, previous.polls + 1, False)
            self._changed.notify_all()
        if error != self._logged:
            if error is not None:
                log.warning("%s; GPU allocations are not exported until it answers", error)
            else:
                log.info("pod-resources API at %s answers", self.client.socket)
            self._logged = error

    def _fetch(self, call: str, method: str, decode: Callable[[Decoder, bytes], T]) -> T:
        """``method``'s answer decoded, counted by result; raises ``PodResourcesError``."""
        result = "ok"
        decoder = Decoder(self._limits)
        try:
            return decode(decoder, self.client.call(method))
        except PodResourcesError as problem:
            result = problem.result
            raise
        except WireError as garbage:
            result = "invalid"
            raise PodResourcesError("invalid", f"{method}: not a valid answer: "
                                    f"{garbage}") from garbage
        finally:
            with self._changed:
                self._requests[(call, result)] += 1
                self._dropped.update(decoder.dropped)

    def _loop(self) -> None:
        while not self._thread.stopping.is_set():
            self.poll()
            self._thread.stopping.wait(self._interval)


# -- devices → GPUs ------------------------------------------------------------------


@dataclass(frozen=True)
class GpuAllocation:
    """One GPU (or GPU instance) allocated to one container."""

    #: The GPU collector's index of the (parent) GPU; "" when it cannot be told.
    gpu: str
    #: The allocated device's UUID (``GPU-…``, ``MIG-…``); "" when it cannot be told.
    uuid: str
    pod: str
    namespace: str
    container: str
    #: ``device_plugin`` or ``dra``.
    source: str


@dataclass(frozen=True)
class GpuDirectory:
    """The node's GPUs as the GPU collector exports them."""

    #: UUID (GPU or MIG instance) → index of the (parent) GPU.
    index_of: Mapping[str, str] = field(default_factory=dict)
    #: Index → the GPU's UUID.
    uuid_of: Mapping[str, str] = field(default_factory=dict)


_INDEX = re.compile(r"(\d+)(?::\d+)?")
_MIG_OF_GPU = re.compile(r"MIG-(GPU-[^/]+)/\d+/\d+")
_DRA_GPU_NAME = re.compile(r"(?:^|[^A-Za-z0-9])gpu-(\d+)(-mig-[A-Za-z0-9.-]+)?$")


def is_gpu_resource(resource_name: str) -> bool:
    """A device-plugin resource whose devices are GPUs or MIG instances."""
    return resource_name in GPU_RESOURCES or resource_name.startswith(MIG_RESOURCE_PREFIX)


def is_gpu_claim(claim: ClaimResource) -> bool:
    """A DRA claim device of the NVIDIA GPU driver (by driver or CDI device name)."""
    return claim.driver_name == NVIDIA_DRA_DRIVER or any(
        name.startswith(("nvidia.com/gpu=", "k8s.gpu.nvidia.com/")) for name in claim.cdi_devices)


def device_gpu(device_id: str, gpus: GpuDirectory) -> tuple[str, str] | None:
    """(gpu index, uuid) of a device-plugin device id; None when it names no GPU."""
    device = device_id.split("::", 1)[0]  # a time-slicing replica: GPU-…::<n>
    if device.startswith(("GPU-", "MIG-")):
        parent = _MIG_OF_GPU.fullmatch(device)  # MIG-GPU-<uuid>/<gi>/<ci> (older plugins)
        index = gpus.index_of.get(device) or (
            gpus.index_of.get(parent.group(1), "") if parent else "")
        return index, device
    whole = _INDEX.fullmatch(device)
    if whole is None:
        return None
    index = whole.group(1)
    return index, gpus.uuid_of.get(index, "") if device == index else ""


def claim_gpu(claim: ClaimResource, gpus: GpuDirectory) -> tuple[str, str] | None:
    """(gpu index, uuid) of a DRA claim device: from the UUID or index a CDI device name
    carries, else from a ``gpu-<index>`` device name; None when neither tells."""
    for name in claim.cdi_devices:
        found = device_gpu(name.rpartition("=")[2], gpus)
        if found is not None and (found[0] or found[1]):
            return found
    for name in (claim.device_name, *claim.cdi_devices):
        match = _DRA_GPU_NAME.search(name)
        if match is not None:
            index = match.group(1)
            return index, "" if match.group(2) else gpus.uuid_of.get(index, "")
    return None


def gpu_allocations(pods: Sequence[PodResources],
                    gpus: GpuDirectory) -> tuple[list[GpuAllocation], int]:
    """Every GPU allocated to a container (deduplicated, sorted), and the count of GPU
    devices that could not be mapped to a GPU (not in the list)."""
    found: set[GpuAllocation] = set()
    unmapped = 0
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    mapped = device_gpu(device_id, gpus)
                    if mapped is None:
                        unmapped += 1
                        continue
                    found.add(GpuAllocation(*mapped, pod.name, pod.namespace, container.name,
                                            "device_plugin"))
            for dynamic in container.dynamic_resources:
                for claim in dynamic.claim_resources:
                    if not is_gpu_claim(claim):
                        continue
                    mapped = claim_gpu(claim, gpus)
                    if mapped is None:
                        unmapped += 1
                        continue
                    found.add(GpuAllocation(*mapped, pod.name, pod.namespace, container.name,
                                            "dra"))
    return sorted(found, key=lambda a: (a.namespace, a.pod, a.container, a.gpu, a.uuid)), \
        unmapped


def allocatable_gpus(resources: AllocatableResources | None) -> dict[str, int]:
    """GPU resource name → devices the kubelet can allocate."""
    counts: Counter[str] = Counter()
    for devices in () if resources is None else resources.devices:
        if is_gpu_resource(devices.resource_name):
            counts[devices.resource_name] += len(devices.device_ids)
    return dict(counts)
