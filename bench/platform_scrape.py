"""What the platform sources add to a scrape: NFS/CFS mountstats, NUMA locality, the run ledger.

**NFS/CFS, side by side.** The same ``mountstats`` file (``--mounts`` NFS v4
mounts, each with the per-op statistics a busy client has) is read by
trainmon with only its ``nfs`` collector and by Debian's
``prometheus-node-exporter`` with only its ``mountstats`` collector (what a
user would otherwise run for NFS client statistics), both pointed at the same
fixture ``/proc``. Scrapes alternate so both see the same machine load; the
table gives latency and the exporter's CPU time per scrape.

**NUMA locality, before/after.** The ``numa`` collector runs on every scrape
of a GPU node; its cost is timed in process for ``--processes`` GPU processes
on 8 GPUs of a two-socket 224-CPU host (fixture ``/proc`` and ``/sys``), and
against the rest of a scrape of ``trainmon serve --demo``
(``trainmon_collector_duration_seconds`` of every collector, summed, with and
without ``numa``; the ``nfs``, ``platform`` and ``ledger`` collectors' share
beside it).

    .venv/bin/python -m bench.platform_scrape
    .venv/bin/python -m bench.platform_scrape --scrapes 300 --mounts 8

Prints markdown for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import requests
from prometheus_client.core import GaugeMetricFamily

from bench import benchlib
from trainmon.collectors.numa import NumaCollector, NumaConfig

#: Per-op lines of a busy NFS v4 client (operation, ops); the other columns follow.
OPERATIONS = (("READ", 812_344), ("WRITE", 2_311), ("GETATTR", 95_002), ("LOOKUP", 40_118),
              ("ACCESS", 22_010), ("OPEN", 18_400), ("CLOSE", 18_399), ("READDIR", 301),
              ("COMMIT", 12), ("FSINFO", 2), ("SETATTR", 9), ("RENAME", 4))


#: Sample lines that are NFS client statistics, in either exporter's names.
NFS_PREFIXES = ("trainmon_nfs_", "node_mountstats_")


def mountstats(mounts: int) -> str:
    """A ``/proc/<pid>/mountstats`` with a root, a tmpfs and ``mounts`` NFS v4.1 mounts."""
    lines = ["device /dev/vda1 mounted on / with fstype ext4",
             "device tmpfs mounted on /dev/shm with fstype tmpfs"]
    for index in range(mounts):
        lines += [
            f"device 10.0.0.{8 + index}:/cfs-{index} mounted on /mnt/cfs{index} with fstype nfs4 "
            "statvers=1.1",
            "\topts:\trw,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,acregmin=3,"
            "acregmax=60,acdirmin=30,acdirmax=60,hard,proto=tcp,timeo=600,retrans=2,sec=sys",
            "\tage:\t86400",
            "\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255",
            "\tsec:\tflavor=1,pseudoflavor=1",
            "\tevents:\t" + " ".join(str(n * 17 + index) for n in range(27)),
            f"\tbytes:\t{8 << 40} {1 << 30} 0 0 {8 << 40} {1 << 30} {2 << 28} {1 << 18}",
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
            "\txprt:\ttcp 870 1 2 0 11 1009921 1009919 2 39918213 0 32 9912 112",
            "\tper-op statistics",
        ]
        for name, ops in OPERATIONS:
            lines.append(f"\t{name:>12}: {ops} {ops} 0 {ops * 240} {ops * 180} "
                         f"{ops // 10} {ops * 3} {ops * 4} 0")
        lines.append("")
    return "\n".join(lines) + "\n"


def nfs_fixture(folder: Path, mounts: int) -> Path:
    proc = folder / "proc"
    text = mountstats(mounts)
    # node_exporter matches the mounts against mountinfo
    table = ["22 1 252:1 / / rw,relatime - ext4 /dev/vda1 rw",
             "23 22 0:21 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw"]
    table += [f"{30 + index} 22 0:{60 + index} / /mnt/cfs{index} rw,relatime - nfs4 "
              f"10.0.0.{8 + index}:/cfs-{index} rw,vers=4.1,addr=10.0.0.{8 + index}"
              for index in range(mounts)]
    # trainmon reads pid 1's, node_exporter its own (``self``, which it readlink()s)
    for process in ("1", "4242"):
        (proc / process).mkdir(parents=True)
        (proc / process / "mountstats").write_text(text)
        (proc / process / "mountinfo").write_text("\n".join(table) + "\n")
    (proc / "self").symlink_to("4242")
    return proc


def start_exporters(folder: Path, proc: Path) -> dict[str, tuple[subprocess.Popen[bytes], str]]:
    config = folder / "nfs.yml"
    off = "".join(f"  {name}: {{enabled: false}}\n" for name in (
        "gpu", "network", "infiniband", "disk", "training", "platform", "diagnosis"))
    config.write_text(f"paths: {{proc: '{proc}'}}\ncollectors:\n{off}")
    trainmon = benchlib.start_trainmon(config, quiet=True)
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        trainmon.stop()
        raise SystemExit("prometheus-node-exporter is not installed (apt-get install it)")
    port = benchlib.free_port()
    node = subprocess.Popen(
        [binary, "--collector.disable-defaults", "--collector.mountstats",
         f"--path.procfs={proc}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stderr=subprocess.DEVNULL)
    benchlib.wait_ready(f"http://127.0.0.1:{port}/metrics", node)
    return {"trainmon (nfs)": (trainmon.process, f"{trainmon.url}/metrics"),
            "node_exporter (mountstats)": (node, f"http://127.0.0.1:{port}/metrics")}


def compare_nfs(scrapes: int, mounts: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        exporters = start_exporters(folder, nfs_fixture(folder, mounts))
        try:
            session = requests.Session()
            for _, url in exporters.values():
                for _ in range(10):
                    session.get(url, timeout=10).raise_for_status()
            latency: dict[str, list[float]] = defaultdict(list)
            series: dict[str, int] = {}
            cpu = {name: benchlib.cpu_seconds(process.pid)
                   for name, (process, _) in exporters.items()}
            for _ in range(scrapes):
                for exporter, (_, url) in exporters.items():
                    started = time.perf_counter()
                    body = session.get(url, timeout=10)
                    latency[exporter].append(time.perf_counter() - started)
                    body.raise_for_status()
                    series[exporter] = sum(1 for line in body.text.splitlines()
                                           if line.startswith(NFS_PREFIXES))
            cpu = {name: benchlib.cpu_seconds(process.pid) - cpu[name]
                   for name, (process, _) in exporters.items()}
        finally:
            for process, _ in exporters.values():
                benchlib.stop(process)
    print(f"NFS/CFS: {mounts} NFS v4.1 mounts × {len(OPERATIONS)} operations, "
          f"{scrapes} alternating scrapes each, {os.cpu_count()} CPUs\n")
    print("| exporter | NFS series | p50 ms | p99 ms | CPU ms/scrape |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for exporter, values in latency.items():
        print(f"| {exporter} | {series[exporter]} | {benchlib.percentile(values, 0.5) * 1e3:.2f} | "
              f"{benchlib.percentile(values, 0.99) * 1e3:.2f} | "
              f"{cpu[exporter] / scrapes * 1e3:.2f} |")
    ours, theirs = list(latency)
    print(f"\nratio trainmon/node_exporter: CPU/scrape {cpu[ours] / max(cpu[theirs], 1e-9):.2f}, "
          f"p50 {statistics.median(latency[ours]) / statistics.median(latency[theirs]):.2f}\n")


def numa_fixture(root: Path, processes: int) -> tuple[GaugeMetricFamily, dict[int, list[object]]]:
    """Two 112-CPU sockets, 8 GPUs (0-3 on node 0), ``processes`` spread over them."""
    sockets = ("0-55,112-167", "56-111,168-223")
    for node, cpus in enumerate(sockets):
        folder = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    info = GaugeMetricFamily("trainmon_gpu_info", "GPU identity",
                             labels=["gpu", "uuid", "name", "pci_bus_id", "driver_version"])
    by_gpu: dict[int, list[object]] = defaultdict(list)
    for gpu in range(8):
        bus = 0x18 + 0x10 * gpu
        info.add_metric([str(gpu), f"GPU-{gpu}", "H200", f"00000000:{bus:02X}:00.0", "570"], 1)
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:{bus:02x}:00.0"
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{gpu // 4}\n")
    for index in range(processes):
        gpu, pid = index % 8, 50_000 + index
        by_gpu[gpu].append(type("Process", (), {"pid": pid})())
        status = root / "proc" / str(pid)
        status.mkdir(parents=True)
        # a real status file: ~55 lines, the affinity near its end
        (status / "status").write_text(
            "Name:\tpython3\n" + "".join(f"Field{n}:\t{n}\n" for n in range(48))
            + f"Cpus_allowed_list:\t{sockets[gpu // 4]}\nMems_allowed_list:\t0-1\n")
    return info, by_gpu


def numa_cost(processes: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        info, by_gpu = numa_fixture(root, processes)
        collector = NumaCollector(NumaConfig(), root / "proc", root / "sys", lambda: by_gpu)
        collector.observe([info])
        list(collector.collect())
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            collector.observe([info])
            list(collector.collect())
        wall = (time.perf_counter() - wall) / rounds
        cpu = (time.process_time() - cpu) / rounds
    print(f"NUMA locality, in process: {processes} GPU processes on 8 GPUs, {rounds} collections: "
          f"{wall * 1e3:.2f} ms wall, {cpu * 1e3:.2f} ms CPU per scrape "
          f"({cpu / processes * 1e6:.0f} µs CPU per process)\n")


def demo_share(scrapes: int) -> None:
    """Collector time of a demo scrape, from the daemon's own self-metrics."""
    with tempfile.TemporaryDirectory() as name:
        config = Path(name) / "demo.yml"
        config.write_text(f"collectors:\n  training: {{socket: '{Path(name) / 's.sock'}'}}\n"
                          f"  ledger: {{path: '{Path(name) / 'ledger.sqlite3'}'}}\n")
        daemon = benchlib.start_trainmon(config, quiet=True, args=["--demo"])
        try:
            time.sleep(5.0)  # the jobs' first reports
            session = requests.Session()
            totals: dict[str, list[float]] = defaultdict(list)
            pattern = re.compile(
                r'^trainmon_collector_duration_seconds\{collector="([^"]+)"\} (\S+)$', re.M)
            for _ in range(scrapes):
                text = session.get(f"{daemon.url}/metrics", timeout=10).text
                for collector, seconds in pattern.findall(text):
                    totals[collector].append(float(seconds))
                time.sleep(0.05)
        finally:
            daemon.stop()
    medians = {collector: statistics.median(values) for collector, values in totals.items()}
    whole = sum(medians.values())
    numa = medians.get("numa", 0.0)
    print(f"`trainmon serve --demo`, {scrapes} scrapes, median collector time per scrape: "
          f"{whole * 1e3:.2f} ms with `numa` ({numa * 1e3:.3f} ms of it), "
          f"{(whole - numa) * 1e3:.2f} ms without (+{numa / max(whole - numa, 1e-9):.1%}); "
          f"nfs {medians.get('nfs', 0.0) * 1e3:.3f} ms, platform "
          f"{medians.get('platform', 0.0) * 1e3:.3f} ms, ledger (the run recorder) "
          f"{medians.get('ledger', 0.0) * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--mounts", type=int, default=16)
    parser.add_argument("--processes", type=int, default=64)
    args = parser.parse_args()
    compare_nfs(args.scrapes, args.mounts)
    numa_cost(args.processes, max(100, args.scrapes // 3))
    demo_share(max(50, args.scrapes // 5))


if __name__ == "__main__":
    main()
