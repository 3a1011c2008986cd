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

The messages are decoded by a small proto3 wire codec
(``trainmon.attribution.podresources_wire``), so no ``protobuf`` package is
needed. ``grpcio`` carries the calls and is imported on the first call only: a
node without the socket never loads it (the daemon's RSS budget,
tests/test_footprint.py).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainmon.attribution.podresources_wire import (
    LIMITS,
    AllocatableResources,
    ClaimResource,
    Decoder,
    PodResources,
    PodResourcesLimits,
    WireError,
)
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
    closed, so the next one connects afresh (a restarted kubelet, a new socket): each
    channel keeps its own subchannel, never one shared and backing off."""

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
                # a channel of its own: the process-wide subchannel pool would hand a
                # new channel the old one's connection in back-off, failing fast
                # with the stale error for up to two minutes after a kubelet restart
                ("grpc.use_local_subchannel_pool", 1),
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
