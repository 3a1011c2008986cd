"""NCCL sanity checks against fixture /sys trees and process environments."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from testkit.exposition import scrape
from tests.diagnosis.diagnosis_support import ProcTree, SysTree
from trainmon.collectors.attribution import AttributionCollector, AttributionConfig
from trainmon.diagnosis.nccl import (
    RdmaPort,
    check_environment,
    parse_device_list,
    read_interfaces,
    read_rdma_ports,
)

IB = (RdmaPort("mlx5_0", 1, True, "InfiniBand"), RdmaPort("mlx5_1", 1, True, "InfiniBand"))
IB_DOWN = (RdmaPort("mlx5_0", 1, False, "InfiniBand"),)
NICS = frozenset({"lo", "eth0", "eth1", "ib0", "docker0"})


def problems(environ: dict[str, str], ports: tuple[RdmaPort, ...] = IB,
             interfaces: frozenset[str] = NICS) -> list[str]:
    return [p.problem for p in check_environment(environ, ports, interfaces)]


@pytest.mark.parametrize(
    ("value", "exclude", "exact", "entries"),
    [
        ("eth", False, False, (("eth", None),)),
        ("^docker,lo", True, False, (("docker", None), ("lo", None))),
        ("=eth0", False, True, (("eth0", None),)),
        ("^=docker0", True, True, (("docker0", None),)),
        ("mlx5_0:1,mlx5_1:1", False, False, (("mlx5_0", 1), ("mlx5_1", 1))),
        (" mlx5 , ", False, False, (("mlx5", None),)),
    ],
)
def test_nccl_list_syntax(
    value: str, exclude: bool, exact: bool, entries: tuple[tuple[str, int | None], ...]
) -> None:
    parsed = parse_device_list(value)
    assert (parsed.exclude, parsed.exact, parsed.entries) == (exclude, exact, entries)


def test_a_sane_environment_has_no_problem() -> None:
    environ = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN",
               "WORLD_SIZE": "16"}
    assert problems(environ) == []


def test_ib_disabled_while_rdma_is_active() -> None:
    assert problems({"NCCL_IB_DISABLE": "1"}) == ["ib_disabled_with_rdma"]
    assert problems({"NCCL_IB_DISABLE": "0"}) == []
    assert problems({"NCCL_IB_DISABLE": "1"}, ports=IB_DOWN) == []  # nothing to use anyway
    [problem] = check_environment({"NCCL_IB_DISABLE": "1"}, IB, NICS)
    assert (problem.variable, problem.value) == ("NCCL_IB_DISABLE", "1")
    assert "mlx5_0:1" in problem.detail


@pytest.mark.parametrize(
    ("value", "flagged"),
    [
        ("eth", False),  # prefix of eth0 and eth1
        ("eht0", True),  # a typo
        ("=eth", True),  # exact: no interface is called "eth"
        ("=eth0", False),
        ("eth0,bond0", True),  # one entry names nothing
        ("^bond0", False),  # excluding an absent interface is harmless
        ("eth0:1", False),  # a port is ignored for interfaces
    ],
)
def test_socket_ifname_naming_absent_interfaces(value: str, flagged: bool) -> None:
    found = problems({"NCCL_SOCKET_IFNAME": value})
    assert ("socket_ifname_not_found" in found) is flagged


@pytest.mark.parametrize(
    ("value", "flagged"),
    [
        ("mlx5", False),
        ("mlx5_0:1,mlx5_1:1", False),
        ("mlx5_0:2", True),  # that port does not exist
        ("=mlx5", True),  # exact: no HCA called "mlx5"
        ("mlx4_0", True),
        ("^mlx5_3", False),
    ],
)
def test_ib_hca_naming_absent_hcas_or_ports(value: str, flagged: bool) -> None:
    assert ("ib_hca_not_found" in problems({"NCCL_IB_HCA": value})) is flagged


def test_no_rdma_but_ib_not_disabled_only_for_distributed_processes() -> None:
    assert problems({"WORLD_SIZE": "8"}, ports=()) == ["no_rdma_ib_enabled"]
    assert problems({"MASTER_ADDR": "10.0.0.1"}, ports=IB_DOWN) == ["no_rdma_ib_enabled"]
    assert problems({"WORLD_SIZE": "8", "NCCL_IB_DISABLE": "1"}, ports=()) == []
    assert problems({"WORLD_SIZE": "1", "PATH": "/usr/bin"}, ports=()) == []  # single process


@pytest.mark.parametrize(("level", "flagged"),
                         [("INFO", True), ("trace", True), ("WARN", False), ("VERSION", False)])
def test_verbose_nccl_debug(level: str, flagged: bool) -> None:
    assert ("debug_logging" in problems({"NCCL_DEBUG": level})) is flagged


def test_rdma_ports_and_interfaces_from_the_fixture_trees(
    proc: ProcTree, sys_tree: SysTree
) -> None:
    sys_tree.hca("mlx5_0", 1)
    sys_tree.hca("mlx5_1", 1, state="1: DOWN", link_layer="Ethernet")
    sys_tree.interface("eth0")
    assert read_rdma_ports(sys_tree.root) == (
        RdmaPort("mlx5_0", 1, True, "InfiniBand"), RdmaPort("mlx5_1", 1, False, "Ethernet"))
    proc.add(10, interfaces=["lo", "net1"])  # a pod's own network namespace
    proc.add(11)  # no net/dev: the daemon's view
    assert read_interfaces(proc.root, 10, sys_tree.root) == {"lo", "net1"}
    assert read_interfaces(proc.root, 11, sys_tree.root) == {"eth0"}


def test_collector_exports_each_problem_per_process(proc: ProcTree, sys_tree: SysTree) -> None:
    sys_tree.hca("mlx5_0", 1)
    proc.add(100, environ={"NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO", "SECRET": "hunter2"},
             interfaces=["lo", "eth0"])
    proc.add(101, environ={"NCCL_SOCKET_IFNAME": "eth0"}, interfaces=["lo", "net1"])
    proc.add(102, environ={"NCCL_IB_HCA": "mlx5_0:1", "NCCL_SOCKET_IFNAME": "eth0"},
             interfaces=["eth0"])
    collector = AttributionCollector(
        AttributionConfig(), proc.root, sys_tree.root,
        lambda: {0: [SimpleNamespace(pid=100)], 1: [SimpleNamespace(pid=101)],
                 2: [SimpleNamespace(pid=102)]},
    )
    result = scrape(collector)
    rows = sorted((r["pid"], r["problem"], r["variable"], r["value"])
                  for r in result.labelsets("trainmon_nccl_problem_info"))
    assert rows == [
        ("100", "debug_logging", "NCCL_DEBUG", "INFO"),
        ("100", "ib_disabled_with_rdma", "NCCL_IB_DISABLE", "1"),
        ("101", "socket_ifname_not_found", "NCCL_SOCKET_IFNAME", "eth0"),
    ]
    assert "hunter2" not in result.text  # only NCCL settings are exported
    assert result.value("trainmon_nccl_processes", state="checked") == 3


def test_nccl_checks_can_be_switched_off(proc: ProcTree, sys_tree: SysTree) -> None:
    proc.add(100, environ={"NCCL_DEBUG": "INFO"})
    collector = AttributionCollector(AttributionConfig(nccl_checks=False), proc.root,
                                     sys_tree.root, lambda: {0: [SimpleNamespace(pid=100)]})
    result = scrape(collector)
    assert result.labelsets("trainmon_nccl_problem_info") == []
    assert result.value("trainmon_gpu_process_info", pid="100") == 1
