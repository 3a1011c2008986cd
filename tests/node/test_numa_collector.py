"""NumaCollector behind the real GPU collector, on fixture /proc and /sys trees.

The GPU side is the real ``GPUCollector`` and ``NVML`` facade over the demo's
pynvml-shaped ``SimulatedNVML``, given the bus ids and process lists of each
case (the library is the fake, below our code). Both run in a real
``CollectorRegistry``, so ``trainmon_gpu_info`` reaches the NUMA collector
through ``observe`` exactly as in the daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from testkit.exposition import Scrape
from testkit.node_nvml import NodeNVML
from trainmon.cli import enabled_collectors
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.collectors.numa import NumaCollector, NumaConfig
from trainmon.config import parse_config
from trainmon.core.registry import CollectorRegistry
from trainmon.gpu.nvml import NVML


@pytest.fixture
def node_scrape(
    scrape: Callable[[Any], Scrape],
) -> Iterator[Callable[..., tuple[Scrape, NumaCollector]]]:
    gpus: list[GPUCollector] = []

    def run(
        root: Path, bus_ids: Sequence[str], processes: Mapping[int, Sequence[int]]
    ) -> tuple[Scrape, NumaCollector]:
        gpu = GPUCollector(NVML(NodeNVML(bus_ids, processes)), GPUConfig(gpm=False))
        gpus.append(gpu)
        numa = NumaCollector(NumaConfig(), root / "proc", root / "sys", gpu.processes)
        return scrape(CollectorRegistry([gpu, numa])), numa

    yield run
    for gpu in gpus:
        gpu.stop()


def ratios(result: Scrape) -> dict[tuple[str, str], float]:
    return result.series("trainmon_gpu_process_numa_local_ratio", "gpu", "pid")


def test_two_node_host(
    tree: Callable[[str], Path], node_scrape: Callable[..., tuple[Scrape, NumaCollector]]
) -> None:
    result, numa = node_scrape(
        tree("numa-two-node"),
        # NVML's form: 8-digit domain, upper case; a VMD domain; one GPU sysfs lacks
        ["00000000:1A:00.0", "00000000:3B:00.0", "00010000:01:00.0", "00000000:5E:00.0"],
        {0: [100, 101, 4242], 1: [102, 100], 2: [103], 3: [100]},
    )
    assert result.types["trainmon_gpu_numa_node"] == "gauge"
    assert result.by_gpu("trainmon_gpu_numa_node") == {"0": 0.0, "1": 1.0, "2": 1.0}
    assert ratios(result) == {
        ("0", "100"): 1.0,  # bound to the GPU's socket
        ("0", "101"): 0.5,  # unbound on a two-socket host
        # 4242 exited between NVML's list and the /proc read: no sample, no error
        ("1", "102"): 1.0,
        ("1", "100"): 0.0,  # the far socket
        ("2", "103"): 0.0,  # 0-31:8/16 = node 0's CPUs, the GPU is on node 1
        # GPU 3 has no sysfs device: its topology is unknown, so no ratio
    }
    assert result.value("trainmon_collector_success", collector="numa") == 1.0
    assert numa.health() == {"gpus": 8, "gpus_topology_unknown": 5, "processes_measured": 5}


def test_virtualised_host_says_unknown_not_mismatch(
    tree: Callable[[str], Path], node_scrape: Callable[..., tuple[Scrape, NumaCollector]]
) -> None:
    result, _ = node_scrape(
        tree("numa-virtualised"),
        ["00000000:00:05.0", "00000000:00:06.0"],
        {0: [200, 201], 1: [200, 201]},
    )
    assert result.by_gpu("trainmon_gpu_numa_node") == {"0": -1.0, "1": 0.0}
    # numa_node -1: no ratio at all; the single-node GPU: every CPU is local
    assert ratios(result) == {("1", "200"): 1.0, ("1", "201"): 1.0}


def test_affinity_change_shows_at_the_next_scrape(
    writable_tree: Callable[[str], Path],
    scrape: Callable[[Any], Scrape],
) -> None:
    root = writable_tree("numa-two-node")
    gpu = GPUCollector(
        NVML(NodeNVML(["00000000:1A:00.0"], {0: [100]})), GPUConfig(gpm=False)
    )
    registry = CollectorRegistry(
        [gpu, NumaCollector(NumaConfig(), root / "proc", root / "sys", gpu.processes)]
    )
    try:
        assert ratios(scrape(registry)) == {("0", "100"): 1.0}
        status = root / "proc" / "100" / "status"
        status.write_text(status.read_text().replace("0-7,16-23", "0-3,8-11"))  # taskset -p
        assert ratios(scrape(registry)) == {("0", "100"): 0.5}
    finally:
        gpu.stop()


def test_without_gpu_families_exports_nothing(tree: Callable[[str], Path]) -> None:
    root = tree("numa-two-node")
    numa = NumaCollector(NumaConfig(), root / "proc", root / "sys", lambda: {0: []})
    numa.observe([])
    assert list(numa.collect()) == []


def test_built_only_with_the_gpu_collector() -> None:
    def names(data: object) -> list[str]:
        return [entry.name for entry in enabled_collectors(parse_config(data), demo=False)]

    assert "numa" in names({})
    assert "numa" not in names({"collectors": {"gpu": {"enabled": False}}})
    assert "numa" not in names({"collectors": {"numa": {"enabled": False}}})
    # the diagnosis still sees the NUMA families
    assert names({}).index("diagnosis") > names({}).index("numa")
    assert names({}).index("numa") > names({}).index("gpu")
