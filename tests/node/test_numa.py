"""trainmon.node.numa: CPU lists, bus ids, and the topology read from fixture trees."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trainmon.node.numa import NO_NODE, NumaTopology, allowed_cpus, parse_cpulist, sysfs_bus_id


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-15,32-47", set(range(16)) | set(range(32, 48))),
        ("3", {3}),
        ("0,2,4-5", {0, 2, 4, 5}),
        ("", set()),
        ("\n", set()),
        ("0-31:2/4", {c for c in range(32) if c % 4 < 2}),
        ("0-31:8/16", set(range(8)) | set(range(16, 24))),
        ("1-9:1/3", {1, 4, 7}),  # groups start at the range's first CPU
        ("0-6:3/4", {0, 1, 2, 4, 5, 6}),  # the last group is cut at the range's end
        (" 0-3 ,8 ", {0, 1, 2, 3, 8}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["N", "0-N", "5-3", "0-7:0/4", "0-7:5/4", "0-7:2/0", "a-b", "0,,1", "-1"])
def test_parse_cpulist_rejects_what_the_kernel_would_not_print(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpulist(text)


def test_allowed_cpus_from_status_text() -> None:
    status = "Name:\tpython3\nCpus_allowed:\tff\nCpus_allowed_list:\t0-7\nMems_allowed_list:\t0\n"
    assert allowed_cpus(status) == set(range(8))
    assert allowed_cpus("Name:\tkthreadd\n") is None


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML busId: 8-digit domain, upper case
        ("0000:3B:00.0", "0000:3b:00.0"),  # busIdLegacy
        ("0000:3b:00.0", "0000:3b:00.0"),  # already sysfs
        ("00010000:01:00.0", "10000:01:00.0"),  # VMD domains are wider than 4 digits
        ("3b:00.0", "0000:3b:00.0"),  # no domain = domain 0
        ("00000000:AB:1F.7\n", "0000:ab:1f.7"),
    ],
)
def test_sysfs_bus_id(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


@pytest.mark.parametrize("text", ["", "GPU-0", "0000:3b:00", "0000:3b:00.8", "0000:3b:000.0"])
def test_sysfs_bus_id_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        sysfs_bus_id(text)


def topology(root: Path) -> NumaTopology:
    return NumaTopology(root / "proc", root / "sys")


def test_two_node_host(tree: Callable[[str], Path]) -> None:
    numa = topology(tree("numa-two-node"))
    assert numa.gpu_node("00000000:1A:00.0") == 0
    assert numa.gpu_node("00000000:3B:00.0") == 1
    assert numa.gpu_node("00010000:01:00.0") == 1
    assert numa.node_cpus(0) == set(range(8)) | set(range(16, 24))
    assert numa.online_cpus() == set(range(32))
    gpu0, gpu1 = "00000000:1A:00.0", "00000000:3B:00.0"
    assert numa.local_ratio(gpu0, 100) == 1.0  # bound to the GPU's socket
    assert numa.local_ratio(gpu1, 100) == 0.0  # ... which is the far one for GPU 1
    assert numa.local_ratio(gpu0, 101) == 0.5  # unbound
    assert numa.local_ratio(gpu0, 102) == 0.0  # 8-11 are on node 1
    assert numa.local_ratio(gpu1, 102) == 1.0
    assert numa.local_ratio(gpu0, 103) == 1.0  # 0-31:8/16 = 0-7,16-23
    assert numa.local_ratio(gpu0, 104) == 0.5  # not-present CPUs 32-63 do not count


def test_unknown_is_none_never_a_mismatch(tree: Callable[[str], Path]) -> None:
    numa = topology(tree("numa-two-node"))
    gpu0 = "00000000:1A:00.0"
    assert numa.local_ratio(gpu0, 105) is None  # no Cpus_allowed_list line
    assert numa.local_ratio(gpu0, 106) is None  # unparsable list
    assert numa.local_ratio(gpu0, 4242) is None  # exited after NVML listed it
    assert numa.gpu_node("00000000:5E:00.0") is None  # no such sysfs device
    assert numa.local_ratio("00000000:5E:00.0", 100) is None
    assert numa.gpu_node("GPU-xyz") is None  # malformed bus id
    assert numa.node_cpus(7) is None


def test_virtualised_host_reports_no_node(tree: Callable[[str], Path]) -> None:
    numa = topology(tree("numa-virtualised"))
    assert numa.gpu_node("00000000:00:05.0") == NO_NODE
    assert numa.node_cpus(NO_NODE) is None
    assert numa.local_ratio("00000000:00:05.0", 200) is None
    # a single-node host: every CPU is local
    assert numa.local_ratio("00000000:00:06.0", 200) == 1.0
    assert numa.local_ratio("00000000:00:06.0", 201) == 1.0


def test_topology_is_cached_and_affinity_reread(writable_tree: Callable[[str], Path]) -> None:
    root = writable_tree("numa-two-node")
    numa = topology(root)
    gpu0 = "00000000:1A:00.0"
    assert numa.local_ratio(gpu0, 100) == 1.0
    status = root / "proc" / "100" / "status"
    status.write_text(status.read_text().replace("0-7,16-23", "8-15"))  # taskset -p
    (root / "sys" / "bus" / "pci" / "devices" / "0000:1a:00.0" / "numa_node").write_text("1\n")
    assert numa.local_ratio(gpu0, 100) == 0.0  # affinity read now, GPU node from the cache
    status.unlink()
    assert numa.local_ratio(gpu0, 100) is None


def test_cpu_less_node_gives_no_ratio(writable_tree: Callable[[str], Path]) -> None:
    root = writable_tree("numa-two-node")
    (root / "sys" / "devices" / "system" / "node" / "node1" / "cpulist").write_text("\n")
    numa = topology(root)
    assert numa.node_cpus(1) == frozenset()
    assert numa.local_ratio("00000000:3B:00.0", 100) is None
