"""PSI, steal time and cgroup throttling: the parsers, the reader on fixture trees, and the
collector's exposition (its ranks from a real training store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.exposition import Scrape
from tests.training.training_support import FakeClock, line
from trainmon.collectors.pressure import PressureCollector
from trainmon.node.pressure import (
    CpuCgroup,
    CPUEvidenceReader,
    cpu_cgroup,
    parse_pressure,
    parse_steal_ticks,
    parse_throttled_seconds,
)
from trainmon.training.protocol import parse_report
from trainmon.training.store import TrainingStore

Tree = Callable[[str], Path]


# -- parsers -------------------------------------------------------------------


def test_pressure_totals_are_microseconds_per_scope() -> None:
    text = ("some avg10=1.50 avg60=0.80 avg300=0.20 total=123456789\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=42\n")
    assert parse_pressure(text) == {"some": 123.456789, "full": 0.000042}


@pytest.mark.parametrize("text", [
    "",
    "some avg10=1.50 avg60=0.80 avg300=0.20\n",  # no total
    "some avg10=1.50 total=-3\n",  # not a count
    "partial avg10=0.00 total=5\n",  # an unknown scope
])
def test_pressure_lines_without_a_usable_total_are_skipped(text: str) -> None:
    assert parse_pressure(text) == {}


def test_steal_is_the_eighth_value_of_the_cpu_line() -> None:
    text = "cpu0 1 2 3 4 5 6 7 99 0 0\ncpu  10 20 30 40 50 60 70 4321 0 0\n"
    assert parse_steal_ticks(text) == 4321


@pytest.mark.parametrize("text", [
    "cpu  1000 20 300 40000 500 6 7\n",  # 2.6.9: no steal column
    "cpu0 1 2 3 4 5 6 7 8\n",  # no aggregate line
    "cpu  1 2 3 4 5 6 7 x\n",
])
def test_steal_is_none_where_the_kernel_does_not_tell(text: str) -> None:
    assert parse_steal_ticks(text) is None


@pytest.mark.parametrize(("text", "expected"), [
    ("4:cpu,cpuacct:/kubepods/a\n0::/\n", CpuCgroup(1, "/kubepods/a", "cpu,cpuacct")),
    ("0::/system.slice/x.scope\n", CpuCgroup(2, "/system.slice/x.scope")),
    # cpuacct and cpuset are not the cpu controller: the v2 line is used
    ("3:cpuacct:/a\n2:cpuset:/b\n0::/c\n", CpuCgroup(2, "/c")),
    ("3:cpuacct,cpu:/a\n", CpuCgroup(1, "/a", "cpuacct,cpu")),
    ("0::/../../kubepods/pod1\n", None),  # outside the reader's cgroup namespace
    ("1:name=systemd:/user.slice\n", None),
    ("garbage\n5:cpu:relative\n", None),
])
def test_the_cpu_controllers_cgroup(text: str, expected: CpuCgroup | None) -> None:
    assert cpu_cgroup(text) == expected


def test_throttled_time_by_version() -> None:
    assert parse_throttled_seconds("nr_throttled 3\nthrottled_time 2500000000\n", 1) == 2.5
    assert parse_throttled_seconds("nr_throttled 3\nthrottled_usec 750000\n", 2) == 0.75
    # each version's field only; v2 without the cpu controller has no throttling lines
    assert parse_throttled_seconds("throttled_usec 750000\n", 1) is None
    assert parse_throttled_seconds("usage_usec 5000\nuser_usec 4000\n", 2) is None


# -- the reader on fixture trees ---------------------------------------------------


def reader(root: Path) -> CPUEvidenceReader:
    return CPUEvidenceReader(root / "proc", root / "sys", user_hz=100)


def test_psi_and_steal_of_a_current_kernel(tree: Tree) -> None:
    found = reader(tree("pressure-host"))
    assert {totals.resource: dict(totals.seconds) for totals in found.pressure()} == {
        "cpu": {"some": 123.456789},  # the system-wide cpu full line is left out
        "io": {"some": 2.000001, "full": 1.500002},
        "memory": {"some": 0.000303, "full": 0.000101},
    }
    assert found.steal_seconds() == 43.21


@pytest.mark.parametrize(("name", "steal"), [
    ("pressure-old-kernel", None),
    ("pressure-psi-disabled", 0.0),
])
def test_no_psi_gives_no_pressure_not_zero(tree: Tree, name: str, steal: float | None) -> None:
    found = reader(tree(name))
    assert found.pressure() == []
    assert found.steal_seconds() == steal


@pytest.mark.parametrize(("pid", "seconds"), [
    (100, 2.5),  # v1 cpu,cpuacct, Kubernetes container on a hybrid host
    (101, 0.75),  # v2, Slurm task
    (102, None),  # outside the cgroup namespace
    (103, 1.0),  # v1 cpu mounted on its own
    (104, None),  # v2 without the cpu controller
    (105, None),  # exited
    (106, 0.000042),  # hybrid host, v2 under unified/
])
def test_throttled_seconds_of_each_process(tree: Tree, pid: int, seconds: float | None) -> None:
    assert reader(tree("pressure-host")).throttled_seconds(pid) == seconds


# -- the collector -------------------------------------------------------------------


def store_with(*ranks: tuple[int, int | None, str]) -> TrainingStore:
    """A training store holding one report per (rank, sender pid, transport)."""
    store = TrainingStore(clock=FakeClock())
    for rank, sender_pid, transport in ranks:
        store.ingest(parse_report(line(job="llm", rank=rank, pid=7)), transport, sender_pid)
    return store


def test_collector_exports_node_pressure_steal_and_ranks_by_kernel_named_pid(
    tree: Tree, scrape: Callable[[PressureCollector], Scrape]
) -> None:
    root = tree("pressure-host")
    # rank 0 and 1 sent over the socket (the kernel named them 100 and 101); rank 2 sent
    # from a process the kernel could not name; rank 3 over HTTP. Their own pid (7)
    # is never read.
    store = store_with((0, 100, "unix"), (1, 101, "unix"), (2, None, "unix"), (3, None, "http"))
    collector = PressureCollector(root / "proc", root / "sys", store, user_hz=100)
    result = scrape(collector)
    assert result.series("trainmon_node_pressure_seconds_total", "resource", "scope") == {
        ("cpu", "some"): 123.456789, ("io", "some"): 2.000001, ("io", "full"): 1.500002,
        ("memory", "some"): 0.000303, ("memory", "full"): 0.000101,
    }
    assert result.value("trainmon_node_cpu_steal_seconds_total") == 43.21
    assert result.series("trainmon_training_rank_cpu_throttled_seconds_total",
                         "job", "owner", "rank") == {
        ("llm", "local", "0"): 2.5, ("llm", "local", "1"): 0.75,
    }
    assert result.types["trainmon_training_rank_cpu_throttled_seconds_total"] == "counter"
    assert collector.health() == {"psi": True, "ranks": 4, "ranks_unidentified": 2,
                                  "ranks_measured": 2}


def test_collector_without_psi_steal_or_ranks_exports_nothing(
    tree: Tree, scrape: Callable[[PressureCollector], Scrape]
) -> None:
    root = tree("pressure-old-kernel")
    result = scrape(PressureCollector(root / "proc", root / "sys", None, user_hz=100))
    assert result.samples == {}


def test_a_process_that_moves_reads_its_new_cgroup_and_a_removed_one_reads_none(
    writable_tree: Tree,
) -> None:
    root = writable_tree("pressure-host")
    found = reader(root)
    assert found.throttled_seconds(101) == 0.75
    moved = (root / "proc" / "100" / "cgroup").read_text()
    (root / "proc" / "101" / "cgroup").write_text(moved)
    assert found.throttled_seconds(101) == 2.5
    stat = next((root / "sys" / "fs" / "cgroup" / "cpu,cpuacct").rglob("cpu.stat"))
    stat.write_text("nr_throttled 300\nthrottled_time 3000000000\n")
    assert found.throttled_seconds(101) == 3.0  # read again on every call
    stat.unlink()
    assert found.throttled_seconds(101) is None
    assert found.throttled_seconds(100) is None
