"""``trainmon serve --demo``: the real node collectors over the simulated node's files,
and its run history: the earlier runs it seeds, its runs, ``trainmon compare``."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.exposition import parse
from testkit.prometheus import wait_until
from trainmon.contract import THROUGHPUT_REGRESSION_RATIO
from trainmon.demo.cvm import PLACEMENT_LABELS
from trainmon.demo.history import EARLIER_RUNS, PRICE_PER_GPU_HOUR
from trainmon.demo.jobs import DEMO_JOBS, RANKS_PER_JOB
from trainmon.demo.node import SimulatedNodeFiles


def test_demo_node_serves_simulated_nic_disk_and_infiniband(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(args=["--demo"])
    first = parse(daemon.metrics())
    assert [labels["mode"] for labels in first.labelsets("trainmon_build_info")] == ["demo"]

    received = first.by_device("trainmon_network_receive_bytes_total")
    assert set(received) == {"eth0"}  # lo, docker0 excluded
    assert first.by_device("trainmon_network_speed_bytes") == {"eth0": 25e9 / 8}

    reads = first.by_device("trainmon_disk_reads_completed_total")
    assert set(reads) == {"nvme0n1", "sda"}  # no p1, no loop

    rates = first.samples["trainmon_infiniband_rate_bytes"]
    assert set(rates.values()) == {200e9 / 8}
    assert set(first.samples["trainmon_infiniband_port_up"].values()) == {1.0}

    time.sleep(2.2)
    second = parse(daemon.metrics())
    after = second.by_device("trainmon_network_receive_bytes_total")["eth0"]
    assert 180e6 * 1.0 < after - received["eth0"] < 180e6 * 4  # ~180 MB/s of dataset traffic
    assert second.by_device("trainmon_disk_reads_completed_total")["nvme0n1"] > reads["nvme0n1"]


def test_demo_node_serves_numa_locality_and_cfs_statistics(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(args=["--demo"])
    first = parse(daemon.metrics())
    assert first.by_gpu("trainmon_gpu_numa_node") == {
        str(gpu): 0.0 if gpu < 4 else 1.0 for gpu in range(8)
    }
    ratios = first.series("trainmon_gpu_process_numa_local_ratio", "gpu", "pid")
    # the starved job's process on GPU 3 is bound to the far socket; every other one is local
    assert ratios == {(str(gpu), str(41000 + gpu)): 0.0 if gpu == 3 else 1.0 for gpu in range(8)}
    assert first.labelsets("trainmon_nfs_mount_info") == [{
        "mountpoint": "/mnt/cfs", "server": "10.0.0.8", "export": "/cfs-dataset",
        "fstype": "nfs4", "version": "4.0",
    }]  # fmt: skip
    operations = first.series("trainmon_nfs_operations_total", "mountpoint", "operation")
    assert {op for _, op in operations} == {"READ", "GETATTR", "LOOKUP", "ACCESS", "OPEN", "CLOSE"}
    read = first.value("trainmon_nfs_read_bytes_total", mountpoint="/mnt/cfs")
    received = first.by_device("trainmon_network_receive_bytes_total")["eth0"]
    assert read is not None and 0.95 < read / received < 1.05  # the dataset is eth0's traffic
    mean_rtt = first.value(
        "trainmon_nfs_operation_rtt_seconds_total", mountpoint="/mnt/cfs", operation="READ"
    ) / operations[("/mnt/cfs", "READ")]
    assert 0.001 < mean_rtt < 0.02  # milliseconds, as a loaded CFS answers 1 MiB reads

    time.sleep(2.2)
    second = parse(daemon.metrics())
    after = second.value("trainmon_nfs_read_bytes_total", mountpoint="/mnt/cfs")
    assert after is not None and 180e6 * 1.0 < after - read < 180e6 * 4


def test_demo_tree_mounts_for_the_checkpoint_classification(tmp_path: Path) -> None:
    files = SimulatedNodeFiles(root=tmp_path)
    mountinfo = (files.proc_root / "1" / "mountinfo").read_text().splitlines()
    mounts = {
        line.split()[4]: (line.split()[2], *line.split(" - ")[1].split()[:2]) for line in mountinfo
    }
    assert mounts == {
        "/": ("8:0", "ext4", "/dev/sda"),
        "/data": ("259:1", "xfs", "/dev/nvme0n1p1"),
        "/mnt/cfs": ("0:52", "nfs4", "10.0.0.8:/cfs-dataset"),
        "/dev/shm": ("0:23", "tmpfs", "tmpfs"),
    }
    for number, name in (("8:0", "sda"), ("259:1", "nvme0n1p1")):
        entry = files.sys_root / "dev" / "block" / number
        assert entry.is_symlink() and entry.resolve() == (files.sys_root / "class" / "block" / name)
        assert not (entry / "serial").exists()  # sda is the demo's system disk, no cloud serial
    SimulatedNodeFiles(root=tmp_path)  # rebuilding over an existing tree keeps it valid
    assert (files.sys_root / "dev" / "block" / "8:0").resolve().name == "sda"


def _runs(ledger: Path) -> list[dict[str, Any]]:
    """``trainmon runs --json`` of ``ledger``, newest first."""
    done = subprocess.run([*trainmon_command(), "runs", "--json", "--ledger", str(ledger)],
                          capture_output=True, text=True, timeout=30, check=True)
    runs: list[dict[str, Any]] = json.loads(done.stdout)["runs"]
    return runs


#: The test's ledger ticks, and how long a run is measured before it is compared.
FLUSH_SECONDS = 1.0
MEASURED_SECONDS = 5.0


def _measured_demo_runs(ledger: Path, daemon: Daemon) -> dict[str, str]:
    """job → the demo start's run that goes on (its restart after the crash the demo
    simulates early, the run its log names) once the ledger has measured it
    MEASURED_SECONDS."""
    found: dict[str, str] = {}

    def measured() -> bool:
        found.clear()
        named = daemon.log()
        for run in _runs(ledger):
            summary = run["summary"] or {}
            if run["run"] not in seeded and run["ended"] is None and \
                    f" {run['run']} --ledger" in named and \
                    summary.get("samples_per_second_median") and \
                    summary["duration_seconds"] >= MEASURED_SECONDS:
                found.setdefault(run["job"], run["run"])
        return len(found) == 2

    seeded = {earlier.run for earlier in EARLIER_RUNS}
    wait_until(measured, 60, f"the demo's runs measured in {ledger}:\n{daemon.log()}")
    return found


@pytest.mark.integration  # a daemon that runs for a minute, until the demo's runs end
def test_demo_seeds_an_earlier_faster_run_that_compare_explains(
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    ledger = tmp_path / "demo-ledger.sqlite3"
    config = {"collectors": {"ledger": {"path": str(ledger), "flush_seconds": FLUSH_SECONDS}}}
    daemon = start_daemon(config=config, args=["--demo"])
    first = parse(daemon.metrics())
    assert first.value("trainmon_ledger_price_per_gpu_hour", currency="USD") == \
        PRICE_PER_GPU_HOUR
    (node,) = first.labelsets("trainmon_node_info")
    assert {name: node[name] for name in PLACEMENT_LABELS} == dict(PLACEMENT_LABELS)
    assert node["zone"] == "ap-shanghai-5"
    current = _measured_demo_runs(ledger, daemon)
    assert f"demo: its runs: trainmon runs --ledger {shlex.quote(str(ledger))}" in daemon.log()

    for earlier in EARLIER_RUNS:
        job = earlier.job.name
        command = (f"trainmon compare {earlier.run} {current[job]} "
                   f"--ledger {shlex.quote(str(ledger))}")
        assert command in daemon.log()
        done = subprocess.run([*trainmon_command(), *shlex.split(command)[1:], "--json"],
                              capture_output=True, text=True, timeout=30, check=True)
        comparison = json.loads(done.stdout)
        assert comparison["a"]["end_reason"] == "finished"
        assert comparison["a"]["config_hash"] == comparison["b"]["config_hash"]
        changes = [(c["kind"], c["key"], c["a"], c["b"]) for c in comparison["changes"]]
        if job == "demo-healthy":
            assert changes == [("environment", "NCCL_ALGO", "Ring", "Tree")], comparison
        else:
            assert [change[:2] for change in changes] == [("data", "data")], comparison
            assert "from local NVMe/disk to CFS/NFS" in comparison["summary"]
        # The earlier run's samples/s are the simulation's; today's, slower by more than
        # the alert's threshold as simulated, are measured over a few one-second ledger
        # ticks here, too coarse to tell by how much (test_demo_panels.py measures it
        # in Prometheus, where the alert fires).
        throughput = comparison["throughput"]
        simulated = RANKS_PER_JOB * earlier.samples_per_second_per_rank
        assert abs(throughput["a"] / simulated - 1) < 0.02, (throughput, simulated)
        today = next(demo for demo in DEMO_JOBS if demo.name == job)
        assert earlier.job.step_seconds / today.step_seconds - 1 < -THROUGHPUT_REGRESSION_RATIO
        assert throughput["change_ratio"] < 0, throughput
        assert comparison["summary"].startswith("samples/s −"), comparison["summary"]
        cost = comparison["cost_per_million_samples"]
        assert cost is not None and cost["currency"] == "USD" and cost["b"] > cost["a"]

    # A second start: new runs, and the seeded history still once.
    assert daemon.stop() == 0
    again = start_daemon(config=config, args=["--demo"])
    second = _measured_demo_runs(ledger, again)
    assert set(second.values()).isdisjoint(current.values())
    assert "earlier runs seeded" in daemon.log() and "earlier runs seeded" not in again.log()
    runs = {run["run"]: run for run in _runs(ledger)}
    expected = {*(e.run for e in EARLIER_RUNS), *current.values(), *second.values()}
    assert expected <= set(runs)
    # and the runs each start's jobs crashed early (their restarts are the runs above)
    assert all(runs[run]["end_reason"] == "crashed" for run in set(runs) - expected), runs
