"""Helpers for the diagnosis tests (imported by the test modules, tests/conftest.py,
tests/test_doctor.py and tests/runs).

``job_verdicts(scrape)`` reads the per-job bottleneck from a rendering
(``testkit.exposition``); ``evaluated(registry)`` evaluates once, then scrapes;
``VerdictProbe`` is a derived collector after the diagnosis (where the ledger
is) that records the verdicts of every evaluation, and ``SteppingJob`` a real
``Reporter`` stepping in a thread. ``ProcTree`` and ``SysTree`` write miniature
``/proc`` and ``/sys`` trees. ``ContractSource`` is a data source that emits
metric-contract samples the test sets (a stand-in for the GPU, training and node
collectors below the diagnosis collector); ``PlatformNode`` (the platform risk
findings; ``job``, ``codes`` and ``finding`` read its ``doctor --json`` document) and
``StarvedNode`` (a job starved by its input, served as Prometheus text) are nodes
built on it. ``Node`` is a simulated node whose ranks step at given per-step seconds, fed to a
diagnosis collector on an injected clock (``diagnosing``; ``healthy_job``,
``findings``: the rule tests). ``doctor(*args)`` runs ``trainmon doctor``, ``fake_gpu_env`` points a
process at the fake NVML with a scenario, ``wait_for_steps`` waits until a daemon's
jobs have reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry as PrometheusRegistry
from prometheus_client import generate_latest
from prometheus_client.core import Metric

from testkit.daemon import Daemon, free_port, trainmon_command
from testkit.exposition import Labels, Scrape, labels, parse, scrape
from trainmon.client import Reporter
from trainmon.collectors.diagnosis import DiagnosisCollector
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.measure import MEASURED_SAMPLES
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.report.document import report_json
from trainmon.report.model import Report, build_report

#: Seconds to wait for what an evaluation loop of a fraction of a second owes.
EVALUATION_TIMEOUT_SECONDS = 20.0


def job_verdicts(result: Scrape) -> dict[str, str]:
    """job → the kind whose trainmon_bottleneck is 1."""
    return {dict(k)["job"]: dict(k)["kind"]
            for k, v in result.samples.get("trainmon_bottleneck", {}).items() if v == 1}


def evaluated(registry: CollectorRegistry) -> Scrape:
    """One evaluation of ``registry`` (what its loop does every interval), then a scrape."""
    registry.evaluate()
    return scrape(registry)


class ProcTree:
    """A miniature ``/proc``: ``add(pid, cgroup=..., environ={...}, interfaces=[...])``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        cgroup: str = "0::/\n",
        environ: Mapping[str, str] | None = None,
        interfaces: Iterable[str] | None = None,
    ) -> Path:
        directory = self.root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup").write_text(cgroup)
        if environ is not None:
            (directory / "environ").write_bytes(
                b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
        if interfaces is not None:
            (directory / "net").mkdir(exist_ok=True)
            header = ("Inter-|   Receive                            |  Transmit\n"
                      " face |bytes    packets errs drop fifo frame compressed multicast|"
                      "bytes    packets errs drop fifo colls carrier compressed\n")
            rows = "".join(f"{name:>6}: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n" for name in interfaces)
            (directory / "net" / "dev").write_text(header + rows)
        return directory


class SysTree:
    """A miniature ``/sys``: RDMA ports and network interfaces."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "class" / "net").mkdir(parents=True, exist_ok=True)

    def hca(self, device: str, port: int = 1, state: str = "4: ACTIVE",
            link_layer: str = "InfiniBand") -> None:
        directory = self.root / "class" / "infiniband" / device / "ports" / str(port)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "state").write_text(state + "\n")
        (directory / "link_layer").write_text(link_layer + "\n")

    def interface(self, name: str) -> None:
        (self.root / "class" / "net" / name).mkdir(parents=True, exist_ok=True)


@dataclass(eq=False)
class ContractSource(Collector):
    """Emits metric-contract samples whose exact sample names and values the test sets.

    ``source.samples["trainmon_training_steps_total"][labels(job="a", rank="0")] = 10``
    (counters by their ``_total`` name, histograms by ``_sum``/``_count``).
    """

    name: str = "contract"
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def set(self, sample: str, value: float, /, **label_values: str) -> None:
        self.samples.setdefault(sample, {})[labels(**label_values)] = value

    def add(self, sample: str, increase: float, /, **label_values: str) -> None:
        series = self.samples.setdefault(sample, {})
        key = labels(**label_values)
        series[key] = series.get(key, 0.0) + increase

    def collect(self) -> Iterable[Metric]:
        families: list[Metric] = []
        for name, series in self.samples.items():
            family = Metric(name, "test samples", "untyped")
            for label_set, value in series.items():
                family.add_sample(name, dict(label_set), value)
            families.append(family)
        return families


class VerdictProbe(Collector):
    """Registered after the diagnosis: job → kind of every evaluation that reached it."""

    name = "probe"

    def __init__(self) -> None:
        self.verdicts: list[dict[str, str]] = []
        self._changed = threading.Condition()

    def observe(self, families: Sequence[Metric]) -> None:
        current = {
            sample.labels["job"]: sample.labels["kind"]
            for family in families if family.name == "trainmon_bottleneck"
            for sample in family.samples if sample.value == 1
        }
        with self._changed:
            self.verdicts.append(current)
            self._changed.notify_all()

    def collect(self) -> Iterable[Metric]:
        return []

    def wait_for(self, condition: Callable[[list[dict[str, str]]], bool],
                 timeout: float = EVALUATION_TIMEOUT_SECONDS) -> dict[str, str]:
        """The verdicts of the first evaluation after which ``condition(verdicts)`` holds."""
        with self._changed:
            met = self._changed.wait_for(lambda: condition(self.verdicts), timeout)
            assert met, f"after {len(self.verdicts)} evaluations: {self.verdicts[-3:]}"
            return self.verdicts[-1]


def held(job: str, kind: str, evaluations: int) -> Callable[[list[dict[str, str]]], bool]:
    """A ``VerdictProbe.wait_for`` condition: the last ``evaluations`` said ``kind`` for ``job``."""
    def condition(verdicts: list[dict[str, str]]) -> bool:
        recent = verdicts[-evaluations:]
        return len(recent) == evaluations and all(v.get(job) == kind for v in recent)
    return condition


class SteppingJob:
    """A real ``Reporter`` (rank 0 of 1, GPU 0) stepping every 10 ms in a thread,
    reporting every 50 ms to ``endpoint``; ``close()`` ends the run cleanly."""

    def __init__(self, job: str, endpoint: str) -> None:
        self.reporter = Reporter(job, rank=0, world_size=1, gpu="0", endpoint=endpoint,
                                 interval_seconds=0.05, environ={})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._steps, name=f"job-{job}", daemon=True)
        self._thread.start()

    def _steps(self) -> None:
        while not self._stop.wait(0.01):  # the step's "work"
            self.reporter.add_data_wait(0.0005)
            self.reporter.step(samples=4)

    def close(self) -> None:
        """Stop stepping, then ``Reporter.close()``: the final totals and ``ended``."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.reporter.close()


WALL = 1_900_000_000.0


TICK = 5.0


@dataclass
class PlatformNode:
    """Job ``llm``: ranks 0 and 1 on GPUs 0 and 1 (pids 100, 101), 0.5 s steps on busy GPUs.

    Every attribute left at None exports nothing, as a node without that source.
    """

    provider: str | None = "tencent"
    labels: dict[str, str] = field(default_factory=lambda: {"leaf": "leaf-07", "rack": "r12"})
    spot: float | None = None
    metadata_up: float | None = 1.0
    #: Seconds from the end of the window to a scheduled reclaim.
    reclaim_in: float | None = None
    #: Seconds before the end of the window of the last checkpoint.
    checkpoint_age: float | None = None
    checkpoint_storage: tuple[str, str, str] | None = None  # mountpoint, fstype, storage
    #: Training-loop seconds of each rank before the window.
    trained_seconds: float = 100.0
    data_wait: float = 0.01  # of each 0.5 s step
    comm_exposed: float = 0.02  # of each 0.5 s step, measured
    world_size: float | None = None
    numa_nodes: dict[str, int] = field(default_factory=dict)
    numa_ratios: dict[tuple[str, str], float] = field(default_factory=dict)
    #: InfiniBand port mlx5_0:1: ACTIVE?, receive + transmit bytes/s (split evenly).
    ib_up: float | None = None
    ib_rate: float = 0.0
    #: eth0 receive + transmit bytes/s (split evenly).
    nic_rate: float = 1e5
    #: NFS mount /mnt/cfs: read bytes/s, READ ops/s, seconds of RTT per READ.
    nfs_read: float | None = None
    nfs_ops: float = 1000.0
    nfs_rtt: float = 0.012
    at: float = 1000.0
    source: ContractSource = field(default_factory=lambda: ContractSource(name="training"))
    ticks: int = 0

    def wall(self) -> float:
        return WALL + self.at

    def clock(self) -> float:
        return self.at

    def end_wall(self, ticks: int = 6) -> float:
        """Wall time of the last snapshot of a ``window(ticks)``."""
        return WALL + self.at + TICK * (ticks - self.ticks)

    def tick(self) -> None:
        self.at += TICK
        self.ticks += 1
        s = self.source
        steps = TICK / 0.5
        for rank in ("0", "1"):
            key = {"job": "llm", "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=rank, pid=str(100 + int(rank)))
            s.add("trainmon_training_step_seconds_count", steps, **key)
            if "trainmon_training_step_seconds_sum" not in s.samples or (
                    ("job", "llm"), ("rank", rank)) not in s.samples[
                        "trainmon_training_step_seconds_sum"]:
                s.set("trainmon_training_step_seconds_sum", self.trained_seconds, **key)
            s.add("trainmon_training_step_seconds_sum", TICK, **key)
            s.add("trainmon_training_data_wait_seconds_total", steps * self.data_wait, **key)
            s.add("trainmon_training_comm_seconds_total", steps * self.comm_exposed, **key)
            s.add("trainmon_training_comm_exposed_seconds_total", steps * self.comm_exposed,
                  **key)
            s.set("trainmon_training_last_step_timestamp_seconds", self.wall(), **key)
            s.set("trainmon_gpu_utilization_ratio", 0.95, gpu=rank)
            s.set("trainmon_gpu_process_info", 1, gpu=rank, pid=str(100 + int(rank)), pod="",
                  namespace="", container="", slurm_job="", pod_uid="", container_id="")
        if self.world_size is not None:
            s.set("trainmon_training_world_size", self.world_size, job="llm")
        if self.provider is not None:
            s.set("trainmon_node_info", 1, provider=self.provider, instance_id="ins-7f3a",
                  instance_type="GN10Xp.20XLARGE320", region="ap-shanghai",
                  zone="ap-shanghai-5", **self.labels)
        if self.spot is not None:
            s.set("trainmon_node_spot_instance", self.spot)
        if self.metadata_up is not None:
            s.set("trainmon_platform_metadata_up", self.metadata_up)
        if self.reclaim_in is not None:
            s.set("trainmon_node_spot_termination_timestamp_seconds",
                  self.end_wall() + self.reclaim_in)
        if self.checkpoint_age is not None:
            s.set("trainmon_training_last_checkpoint_timestamp_seconds",
                  self.end_wall() - self.checkpoint_age, job="llm")
            s.set("trainmon_training_last_checkpoint_duration_seconds", 12.5, job="llm")
            for rank in ("0", "1"):
                s.set("trainmon_training_checkpoints_total", 4, job="llm", rank=rank)
        if self.checkpoint_storage is not None:
            mountpoint, fstype, storage = self.checkpoint_storage
            s.set("trainmon_training_checkpoint_storage_info", 1, job="llm",
                  mountpoint=mountpoint, fstype=fstype, storage=storage)
        for gpu, numa_node in self.numa_nodes.items():
            s.set("trainmon_gpu_numa_node", numa_node, gpu=gpu)
        for (gpu, pid), ratio in self.numa_ratios.items():
            s.set("trainmon_gpu_process_numa_local_ratio", ratio, gpu=gpu, pid=pid)
        if self.ib_up is not None:
            s.set("trainmon_infiniband_port_up", self.ib_up, device="mlx5_0", port="1")
            s.set("trainmon_infiniband_rate_bytes", 25e9, device="mlx5_0", port="1")
            for direction in ("receive", "transmit"):
                s.add(f"trainmon_infiniband_{direction}_bytes_total", TICK * self.ib_rate / 2,
                      device="mlx5_0", port="1")
        for direction in ("receive", "transmit"):
            s.add(f"trainmon_network_{direction}_bytes_total", TICK * self.nic_rate / 2,
                  device="eth0")
        s.set("trainmon_network_speed_bytes", 3.125e9, device="eth0")
        if self.nfs_read is not None:
            mount = {"mountpoint": "/mnt/cfs"}
            s.set("trainmon_nfs_mount_info", 1, **mount, server="10.0.0.8",
                  export="/cfs-dataset", fstype="nfs4", version="4.1")
            s.add("trainmon_nfs_read_bytes_total", TICK * self.nfs_read, **mount)
            s.add("trainmon_nfs_write_bytes_total", 0.0, **mount)
            s.add("trainmon_nfs_operations_total", TICK * self.nfs_ops, **mount,
                  operation="READ")
            s.add("trainmon_nfs_operation_rtt_seconds_total",
                  TICK * self.nfs_ops * self.nfs_rtt, **mount, operation="READ")

    def snapshot(self) -> ScrapedSamples:
        """The source rendered as Prometheus text and parsed back, as ``doctor --url``."""
        registry = PrometheusRegistry(auto_describe=False)
        registry.register(self.source)
        text = generate_latest(registry).decode()
        return ScrapedSamples.from_text(text, self.at, self.wall(), MEASURED_SAMPLES)

    def window(self, ticks: int = 6) -> Window:
        snapshots = []
        for _ in range(ticks):
            self.tick()
            snapshots.append(self.snapshot())
        return Window(snapshots)

    def diagnosed(self, lang: str = "en", config: DiagnosisConfig | None = None) -> Report:
        """The report of a fresh window, as ``doctor`` renders it."""
        return build_report(self.window(), config or DiagnosisConfig(), {"kind": "local"}, lang)

    def report(self, lang: str = "en", config: DiagnosisConfig | None = None) -> Document:
        """The ``doctor --json`` document of a fresh window."""
        return report_json(self.diagnosed(lang, config))


#: The JSON document (``report_json``), read as JSON.
Document = dict[str, Any]


def job(report: Document, name: str = "llm") -> dict[str, object]:
    [entry] = [j for j in report["jobs"] if j["job"] == name]
    return dict(entry)


def codes(report: Document, name: str = "llm") -> list[str]:
    [entry] = [j for j in report["jobs"] if j["job"] == name]
    return [f["code"] for f in entry["findings"]]


def finding(report: Document, code: str, name: str = "llm") -> dict[str, object]:
    [entry] = [j for j in report["jobs"] if j["job"] == name]
    [found] = [f for f in entry["findings"] if f["code"] == code]
    return dict(found)


class StarvedNode:
    """A node with one job whose rank 1 waits 40 % of each 0.5 s step, GPU sawtooth."""

    def __init__(self) -> None:
        self.source = ContractSource()
        self.requests = 0
        # a job that has stepped for a while: past the diagnosis' warm-up steps
        for rank, wait in (("0", 0.02), ("1", 0.2)):
            key = {"job": "vit", "rank": rank}
            self.source.add("trainmon_training_step_seconds_count", 100, **key)
            self.source.add("trainmon_training_step_seconds_sum", 50.0, **key)
            self.source.add("trainmon_training_data_wait_seconds_total", 100 * wait, **key)

    def advance(self) -> None:
        s = self.source
        for rank, wait in (("0", 0.02), ("1", 0.2)):
            key = {"job": "vit", "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=rank, pid=str(100 + int(rank)))
            s.add("trainmon_training_step_seconds_count", 2, **key)
            s.add("trainmon_training_step_seconds_sum", 1.0, **key)
            s.add("trainmon_training_data_wait_seconds_total", 2 * wait, **key)
            s.set("trainmon_training_last_step_timestamp_seconds", 1.9e9, **key)
        for gpu in ("0", "1"):
            s.set("trainmon_gpu_utilization_ratio", 0.5, gpu=gpu)
            s.set("trainmon_gpu_sawtooth_ratio", 0.7, gpu=gpu)
            s.set("trainmon_gpu_memory_used_bytes", 2**33, gpu=gpu)
        s.set("trainmon_gpu_process_info", 1, gpu="0", pid="100", pod="vit-0", namespace="ml",
              container="main", slurm_job="", pod_uid="u", container_id="c")
        s.set("trainmon_nccl_problem_info", 1, pid="100", problem="debug_logging",
              variable="NCCL_DEBUG", value="INFO")
        s.add("trainmon_disk_io_time_seconds_total", 0.5, device="nvme0n1")
        s.add("trainmon_disk_read_bytes_total", 2e9, device="nvme0n1")
        s.add("trainmon_disk_written_bytes_total", 0, device="nvme0n1")
        s.add("trainmon_network_receive_bytes_total", 1e8, device="eth0")
        s.add("trainmon_network_transmit_bytes_total", 1e7, device="eth0")
        s.set("trainmon_network_speed_bytes", 3.125e9, device="eth0")

    def text(self) -> bytes:
        self.requests += 1
        self.advance()
        registry = PrometheusRegistry(auto_describe=False)
        registry.register(self.source)
        return generate_latest(registry)


def fake_gpu_env(library: Path, scenario: Path, text: str) -> dict[str, str]:
    scenario.write_text(text)
    return {"LD_LIBRARY_PATH": str(library), "FAKENVML_SCENARIO": str(scenario)}


def doctor(*args: str, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*trainmon_command(), "doctor", *args], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})}, check=False,
    )


def wait_for_steps(daemon: Daemon, jobs: tuple[str, ...], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = parse(daemon.metrics()).samples.get("trainmon_training_steps_total", {})
        seen = {dict(labels)["job"] for labels, value in steps.items() if value >= 5}
        if set(jobs) <= seen:
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs did not report in {timeout}s: {steps}")


# -- a simulated node: ranks stepping at given per-step seconds (test_rules, test_group_rules)


def diagnosing(
    config: DiagnosisConfig,
    *sources: Collector,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
) -> CollectorRegistry:
    """The sources, then the diagnosis reading them, in a registry as the daemon has them."""
    return CollectorRegistry(
        [*sources, DiagnosisCollector(config, clock=clock, wall_clock=wall_clock)]
    )

#: The simulated node's Unix time at its clock's zero.
NODE_WALL = 1_700_000_000.0


@dataclass
class Rank:
    """Per-step seconds of one simulated rank."""

    wait: float = 0.01
    work: float = 0.2
    comm: float = 0.02
    gpu: str = ""
    pid: str = ""
    stepping: bool = True
    comm_phase: bool = True
    #: Measured inside the job (Reporter.instrument): ``comm`` is then the exposed
    #: part, ``overlapped`` more seconds of collectives hidden under compute, and
    #: ``comm_bytes`` the bytes per step.
    measured: bool = False
    overlapped: float = 0.0
    comm_bytes: float = 0.0
    #: Seconds of compute that the comm phase's timer also covers (a phase
    #: wrapped around backward and its allreduce).
    phase_covers_work: float = 0.0


@dataclass
class Node:
    """A simulated node: ranks, GPU utilization, links; ``tick`` advances 5 s."""

    ranks: dict[tuple[str, str], Rank] = field(default_factory=dict)
    gpus: dict[str, float] = field(default_factory=dict)
    sawtooth: dict[str, float] = field(default_factory=dict)
    #: GPM readings of GPUs that have GPM: (SM active, SM occupancy, tensor
    #: active, DRAM active), 0-1; GPUs left out export no GPM series.
    gpm: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    #: ``trainmon_gpu_pipe_active_ratio`` by GPU and pipe.
    pipes: dict[str, dict[str, float]] = field(default_factory=dict)
    #: (used, total) memory bytes by GPU.
    memory: dict[str, tuple[float, float]] = field(default_factory=dict)
    now: float = 1000.0
    source: ContractSource = field(default_factory=ContractSource)

    def clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return NODE_WALL + self.now

    def tick(self, seconds: float = 5.0) -> None:
        self.now += seconds
        s = self.source
        for (job, rank), r in self.ranks.items():
            key = {"job": job, "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=r.gpu, pid=r.pid)
            step = r.wait + r.work + r.comm
            steps = seconds / step if r.stepping else 0.0
            s.add("trainmon_training_step_seconds_count", steps, **key)
            s.add("trainmon_training_step_seconds_sum", steps * step, **key)
            s.add("trainmon_training_data_wait_seconds_total", steps * r.wait, **key)
            if r.comm_phase:
                s.add("trainmon_training_phase_seconds_total",
                      steps * (r.comm + r.phase_covers_work), **key, phase="comm")
            if r.measured:
                s.add("trainmon_training_comm_seconds_total", steps * (r.comm + r.overlapped),
                      **key)
                s.add("trainmon_training_comm_exposed_seconds_total", steps * r.comm, **key)
                s.add("trainmon_training_comm_bytes_total", steps * r.comm_bytes, **key)
            if r.stepping or ("trainmon_training_last_step_timestamp_seconds" not in s.samples):
                s.set("trainmon_training_last_step_timestamp_seconds", self.wall(), **key)
        for gpu, utilization in self.gpus.items():
            s.set("trainmon_gpu_utilization_ratio", utilization, gpu=gpu)
            s.set("trainmon_gpu_sawtooth_ratio", self.sawtooth.get(gpu, 0.0), gpu=gpu)
        for gpu, (sm_active, occupancy, tensor, dram) in self.gpm.items():
            s.set("trainmon_gpu_sm_active_ratio", sm_active, gpu=gpu)
            s.set("trainmon_gpu_sm_occupancy_ratio", occupancy, gpu=gpu)
            s.set("trainmon_gpu_tensor_active_ratio", tensor, gpu=gpu)
            s.set("trainmon_gpu_dram_active_ratio", dram, gpu=gpu)
        for gpu, pipes in self.pipes.items():
            for pipe, ratio in pipes.items():
                s.set("trainmon_gpu_pipe_active_ratio", ratio, gpu=gpu, pipe=pipe)
        for gpu, (used, total) in self.memory.items():
            s.set("trainmon_gpu_memory_used_bytes", used, gpu=gpu)
            s.set("trainmon_gpu_memory_total_bytes", total, gpu=gpu)

    def run(self, config: DiagnosisConfig | None = None, ticks: int = 6) -> Scrape:
        collector = diagnosing(config or DiagnosisConfig(), self.source,
                                       clock=self.clock, wall_clock=self.wall)
        result = evaluated(collector)
        for _ in range(ticks):
            self.tick()
            result = evaluated(collector)
        return result


def findings(result: Scrape, job: str) -> set[str]:
    return {row["finding"] for row in result.labelsets("trainmon_diagnosis_finding_info")
            if row["job"] == job}


def healthy_job(node: Node, job: str = "llm", ranks: int = 4, first_gpu: int = 0) -> None:
    for index in range(ranks):
        gpu = str(first_gpu + index)
        node.ranks[(job, str(index))] = Rank(gpu=gpu, pid=str(5000 + first_gpu + index))
        node.gpus[gpu] = 0.95


# -- the hang job (testkit/ddp_job.py hang) ------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The job name the hang job's ranks report.
HANG_JOB = "hang"


def start_hang_ranks(directory: Path, socket: str, release: Path, *options: str,
                world_size: int = 2, endpoints: list[str] | None = None
                ) -> list[subprocess.Popen[bytes]]:
    """``testkit/ddp_job.py hang``'s ranks (job ``HANG_JOB``), reporting to ``socket`` (or each to its ``endpoints``)."""
    env = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
           "TRAINMON_ENDPOINT": f"unix://{socket}", "TRAINMON_JOB": HANG_JOB,
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(
               [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return [subprocess.Popen(
        [sys.executable, "-m", "testkit.ddp_job", "hang", "--release", str(release),
         *options],
        cwd=REPO_ROOT, env={**env, "RANK": str(rank), **(
            {} if endpoints is None else {"TRAINMON_ENDPOINT": endpoints[rank]})},
        stdout=(directory / f"rank-{rank}.log").open("wb"), stderr=subprocess.STDOUT)
        for rank in range(world_size)]


def stop_hang_ranks(ranks: list[subprocess.Popen[bytes]], release: Path) -> None:
    release.touch()
    for process in ranks:
        if process.poll() is None:
            process.kill()
            process.wait()


@dataclass
class RankProcesses:
    """The rank processes of one real job, with their logs; the test ends them."""

    name: str
    started: float
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def failed(self) -> str | None:
        """The log of a rank that has exited (the test ends them), or None while all run."""
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                return f"{self.name} rank exited with {process.returncode}:\n{log.read_text()}"
        return None

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
