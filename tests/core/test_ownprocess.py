"""The daemon's own ``process_*`` metrics, from a miniature /proc and from this process."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from testkit.sources import SteadySource
from trainmon.core.ownprocess import OwnProcessCollector
from trainmon.core.registry import CollectorRegistry

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = resource.getpagesize()



def described(families: Iterable[Any]) -> list[tuple[object, ...]]:
    """Name, HELP, type, unit and samples of each family (trainmon's families and the
    library's are different classes with the same fields)."""
    return [(f.name, f.documentation, f.type, f.unit, f.samples) for f in families]

def fake_proc(root: Path, pid: int) -> Path:
    """``<root>/stat`` (boot time) and ``<root>/<pid>/{stat,limits,fd}`` as Linux writes them."""
    (root / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\nprocesses 42\n")
    process = root / str(pid)
    (process / "fd").mkdir(parents=True)
    for fd in range(5):
        (process / "fd" / str(fd)).write_text("")
    fields = ["S"] + ["0"] * 49
    fields[11], fields[12] = str(3 * TICKS), str(1 * TICKS)  # utime, stime: 3 s + 1 s
    fields[19] = str(600 * TICKS)  # started 600 s after boot
    fields[20], fields[21] = "268435456", "1000"  # vsize bytes, rss pages
    (process / "stat").write_text(f"{pid} (trainmon serve) " + " ".join(fields) + "\n")
    (process / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max open files            1024                 524288               files     \n"
    )
    return root


def values(families: list[Metric]) -> dict[str, float]:
    return {sample.name: sample.value for family in families for sample in family.samples}


def test_the_standard_names_from_a_miniature_proc(tmp_path: Path) -> None:
    collector = OwnProcessCollector(fake_proc(tmp_path, 4242), pid=4242)
    assert values(list(collector.collect())) == {
        "process_cpu_seconds_total": 4.0,
        "process_resident_memory_bytes": 1000.0 * PAGE,
        "process_virtual_memory_bytes": 268435456.0,
        "process_start_time_seconds": 1700000600.0,
        "process_open_fds": 5.0,
        "process_max_fds": 1024.0,
    }


def test_this_process_has_sane_values() -> None:
    sample = values(list(OwnProcessCollector().collect()))
    assert sample["process_resident_memory_bytes"] > 1 << 20
    assert sample["process_cpu_seconds_total"] > 0
    assert sample["process_open_fds"] >= 3
    assert sample["process_start_time_seconds"] <= time.time() + 1


def test_without_procfs_the_collector_is_unavailable(tmp_path: Path) -> None:
    registry = CollectorRegistry([OwnProcessCollector(tmp_path)])
    registry.start()
    families = {family.name: family for family in registry.collect()}
    assert not any(name.startswith("process_") for name in families)
    available = {s.labels["collector"]: s.value for s in families["trainmon_collector_available"].samples}
    assert available == {"process": 0.0}
    state = registry.health()["collectors"]["process"]  # type: ignore[index]
    assert state["state"] == "unavailable" and "procfs is Linux-only" in state["error"]


def test_a_limits_file_the_library_cannot_parse_fails_only_this_collector(
    tmp_path: Path,
) -> None:
    root = fake_proc(tmp_path, 7)
    (root / "7" / "limits").write_text(
        "Max open files            unlimited            unlimited            files     \n"
    )
    registry = CollectorRegistry([OwnProcessCollector(root, pid=7), SteadySource()])
    registry.start()
    families = {family.name: family for family in registry.collect()}
    success = {s.labels["collector"]: s.value for s in families["trainmon_collector_success"].samples}
    assert success == {"process": 0.0, "steady": 1.0}
    assert "example_value" in families
    assert registry.health()["collectors"]["process"]["state"] == "failed"  # type: ignore[index]


def test_the_families_of_prometheus_client_process_collector(tmp_path: Path) -> None:
    """Names, HELP, types, order and values as the library's collector gives them."""
    root = fake_proc(tmp_path, 4242)
    library = ProcessCollector(proc=str(root), pid=lambda: 4242, registry=None)
    assert described(OwnProcessCollector(root, pid=4242).collect()) == described(
        library.collect())
    ours = list(OwnProcessCollector().collect())
    theirs = list(ProcessCollector(registry=None).collect())
    assert [(f.name, f.documentation, f.type) for f in ours] == [
        (f.name, f.documentation, f.type) for f in theirs
    ]


def test_a_process_whose_fd_folder_is_gone_keeps_its_stat_families(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, 9)
    for fd in (root / "9" / "fd").iterdir():
        fd.unlink()
    (root / "9" / "fd").rmdir()
    library = ProcessCollector(proc=str(root), pid=lambda: 9, registry=None)
    ours = list(OwnProcessCollector(root, pid=9).collect())
    assert described(ours) == described(library.collect())
    assert [f.name for f in ours] == [
        "process_virtual_memory_bytes", "process_resident_memory_bytes",
        "process_start_time_seconds", "process_cpu_seconds",
    ]
