"""The pod-resources wire codec and the device → GPU mapping (``trainmon.attribution.podresources``).

The expected bytes are written out by hand from the proto3 encoding rules and the
field numbers of ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``, so the
decoder is checked against the wire format, not only against its own encoder.
"""

from __future__ import annotations

import pytest

from trainmon.attribution.podresources import (
    GpuAllocation,
    GpuDirectory,
    allocatable_gpus,
    claim_gpu,
    device_gpu,
    gpu_allocations,
)
from trainmon.attribution.podresources_wire import (
    AllocatableResources,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    Decoder,
    DynamicResource,
    PodResources,
    PodResourcesLimits,
    WireError,
    encode_allocatable_response,
    encode_list_response,
    encode_varint,
)

GPU0, GPU1 = "GPU-00000000-fake-4000-8000-000000000000", "GPU-00000001-fake-4000-8000-000000000001"
MIG = "MIG-00000000-fake-4000-8000-000000010001"
GPUS = GpuDirectory(index_of={GPU0: "0", GPU1: "1", MIG: "0"}, uuid_of={"0": GPU0, "1": GPU1})


def test_a_hand_encoded_list_response_decodes() -> None:
    # PodResources{name=1:"nb", namespace=2:"ml", containers=3:{name=1:"c",
    #   devices=2:{resource_name=1:"nvidia.com/gpu", device_ids=2:"0",
    #              topology=3:{nodes=1:{ID=1:1}}}, cpu_ids=3:[2, 3] packed}}
    devices = (b"\x0a\x0envidia.com/gpu" + b"\x12\x010" + b"\x1a\x04\x0a\x02\x08\x01")
    container = b"\x0a\x01c" + b"\x12" + bytes([len(devices)]) + devices + b"\x1a\x02\x02\x03"
    pod = b"\x0a\x02nb\x12\x02ml\x1a" + bytes([len(container)]) + container
    response = b"\x0a" + bytes([len(pod)]) + pod
    (decoded,) = Decoder().list_response(response)
    assert decoded == PodResources("nb", "ml", (ContainerResources(
        "c", (ContainerDevices("nvidia.com/gpu", ("0",), (1,)),), (2, 3)),))
    assert encode_list_response([decoded]) == response


def test_round_trip_with_dra_claims_and_negative_ids() -> None:
    pods = [
        PodResources("train-0", "team-a", (
            ContainerResources("worker", (ContainerDevices("nvidia.com/gpu", (GPU0, GPU1)),),
                               (0, 1, -1)),
            ContainerResources("sidecar"),
        )),
        PodResources("dra-0", "team-b", (ContainerResources("main", dynamic_resources=(
            DynamicResource("gpu-claim", "team-b", (
                ClaimResource(("k8s.gpu.nvidia.com/claim=u1-gpu-1",), "gpu.nvidia.com",
                              "node-1", "gpu-1"),)),)),)),
    ]
    assert Decoder().list_response(encode_list_response(pods)) == tuple(pods)
    allocatable = AllocatableResources((ContainerDevices("nvidia.com/gpu", (GPU0, GPU1)),),
                                       (0, 1, 2))
    assert Decoder().allocatable_response(encode_allocatable_response(allocatable)) \
        == allocatable


def test_unknown_fields_of_every_wire_type_and_unpacked_ids_are_read() -> None:
    container = (b"\x0a\x01c"
                 + b"\x18\x07"                      # cpu_ids=3 unpacked: 7
                 + b"\x22\x04\x0a\x02hi"            # memory=4: skipped
                 + b"\xa8\x06\x2a"                  # field 101 varint
                 + b"\xb1\x06" + b"\x00" * 8        # field 102 fixed64
                 + b"\xbd\x06" + b"\x00" * 4)       # field 103 fixed32
    pod = b"\x0a\x01p\x1a" + bytes([len(container)]) + container + b"\x20\x05"  # cpu_ids=4
    (decoded,) = Decoder().list_response(b"\x0a" + bytes([len(pod)]) + pod)
    assert decoded.containers == (ContainerResources("c", (), (7,)),)


@pytest.mark.parametrize("garbage", [
    pytest.param(b"\x0a", id="truncated-length"),
    pytest.param(b"\x0a\x05ab", id="length-past-the-end"),
    pytest.param(b"\x0b\x00", id="group-wire-type"),
    pytest.param(b"\x07\xff", id="field-zero"),
    pytest.param(b"\x0a" + b"\xff" * 11, id="endless-varint"),
    pytest.param(b"\x0a\x03\x0a\x01\xff", id="name-not-utf8"),
    pytest.param(b"\x08\x01", id="pod-as-varint"),
    pytest.param(b"\x09" + b"\x00" * 3, id="truncated-fixed64"),
])
def test_garbage_raises_wire_error(garbage: bytes) -> None:
    with pytest.raises(WireError):
        Decoder().list_response(garbage)


def test_a_string_past_the_limit_is_garbage() -> None:
    pods = [PodResources("p" * 65, "ns")]
    with pytest.raises(WireError, match="at most 64"):
        Decoder(PodResourcesLimits(max_string_length=64)).list_response(
            encode_list_response(pods))


def test_limits_drop_and_count_pods_containers_and_devices() -> None:
    devices = ContainerDevices("nvidia.com/gpu", tuple(str(i) for i in range(5)))
    claims = DynamicResource("c", "ns", tuple(
        ClaimResource((), "gpu.nvidia.com", "pool", f"gpu-{i}") for i in range(3)))
    container = ContainerResources("c", (devices,), dynamic_resources=(claims,))
    pods = [PodResources(f"p{i}", "ns", (container,) * 4) for i in range(3)]
    decoder = Decoder(PodResourcesLimits(max_pods=2, containers_per_pod=3,
                                         devices_per_container=6))
    decoded = decoder.list_response(encode_list_response(pods))
    assert [pod.name for pod in decoded] == ["p0", "p1"]
    assert all(len(pod.containers) == 3 for pod in decoded)
    kept = decoded[0].containers[0]
    assert kept.devices[0].device_ids == ("0", "1", "2", "3", "4")
    assert len(kept.dynamic_resources[0].claim_resources) == 1
    assert decoder.dropped == {"pods": 1, "containers": 2, "devices": 2 * 3 * 2}


def test_varints_of_int64_are_ten_bytes_for_negatives() -> None:
    assert encode_varint(300) == b"\xac\x02"
    assert len(encode_varint(-1)) == 10


@pytest.mark.parametrize(("device", "expected"), [
    pytest.param(GPU1, ("1", GPU1), id="uuid"),
    pytest.param(f"{GPU1}::3", ("1", f"{GPU1}::3".split("::")[0]), id="time-slicing-replica"),
    pytest.param("1", ("1", GPU1), id="index"),
    pytest.param(MIG, ("0", MIG), id="mig-uuid"),
    pytest.param(f"MIG-{GPU1}/1/0", ("1", f"MIG-{GPU1}/1/0"), id="mig-of-gpu-uuid"),
    pytest.param("0:2", ("0", ""), id="mig-index"),
    pytest.param("MIG-ffffffff-not-here", ("", "MIG-ffffffff-not-here"), id="unknown-mig"),
    pytest.param("nvme0", None, id="not-a-gpu"),
])
def test_device_plugin_ids(device: str, expected: tuple[str, str] | None) -> None:
    assert device_gpu(device, GPUS) == expected


@pytest.mark.parametrize(("claim", "expected"), [
    pytest.param(ClaimResource(("nvidia.com/gpu=" + GPU1,), "gpu.nvidia.com", "n", "x"),
                 ("1", GPU1), id="cdi-uuid"),
    pytest.param(ClaimResource(("k8s.gpu.nvidia.com/claim=6f1e-gpu-1",), "gpu.nvidia.com",
                               "n", "gpu-1"), ("1", GPU1), id="driver-device-name"),
    pytest.param(ClaimResource((), "gpu.nvidia.com", "n", "gpu-0-mig-1g10gb-0"), ("0", ""),
                 id="driver-mig-device"),
    pytest.param(ClaimResource((), "gpu.nvidia.com", "n", "device-7"), None, id="unmapped"),
])
def test_dra_claim_devices(claim: ClaimResource, expected: tuple[str, str] | None) -> None:
    assert claim_gpu(claim, GPUS) == expected


def test_allocations_keep_gpu_resources_only_and_count_unmapped() -> None:
    pods = [PodResources("p", "ns", (ContainerResources("c", (
        ContainerDevices("nvidia.com/gpu", (GPU0, GPU0)),
        ContainerDevices("rdma/hca", ("mlx5_0",)),
        ContainerDevices("nvidia.com/mig-1g.10gb", (MIG,)),
    ), dynamic_resources=(DynamicResource("claim", "ns", (
        ClaimResource((), "gpu.nvidia.com", "n", "gpu-1"),
        ClaimResource((), "gpu.nvidia.com", "n", "opaque"),
        ClaimResource(("vendor.com/nic=eth1",), "nic.vendor.com", "n", "eth1"),
    )),)),))]
    allocations, unmapped = gpu_allocations(pods, GPUS)
    assert allocations == [
        GpuAllocation("0", GPU0, "p", "ns", "c", "device_plugin"),
        GpuAllocation("0", MIG, "p", "ns", "c", "device_plugin"),
        GpuAllocation("1", GPU1, "p", "ns", "c", "dra"),
    ]
    assert unmapped == 1
    assert allocatable_gpus(AllocatableResources((
        ContainerDevices("nvidia.com/gpu", (GPU0, GPU1)),
        ContainerDevices("rdma/hca", ("mlx5_0",))))) == {"nvidia.com/gpu": 2}
