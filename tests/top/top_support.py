"""A simulated node's ``/metrics`` for the ``trainmon top`` tests, and tmux to drive it.

``SimulatedNode`` writes the Prometheus text a daemon would export for a few
jobs (the series ``trainmon.diagnosis.measure`` reads: rank info, step
counters, data wait, measured and per-group exposed communication, samples,
stall reports, GPUs, processes, goodput), one tick of ``TICK`` seconds at a
time; ``view`` parses each tick back through ``ScrapedSamples.from_text`` into a
``Recorder``, as ``top`` reads a daemon. ``Tmux`` runs a command in a detached
tmux session on a server of its own and reads the pane back.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainmon.diagnosis.samples import ScrapedSamples
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.top.model import TOP_SAMPLES, Recorder, TopView

WALL = 1_900_000_000.0
TICK = 1.0
SOURCE = "http://127.0.0.1:19400/metrics"


@dataclass
class SimulatedJob:
    name: str
    #: GPU index of each rank (rank i on ``gpus[i]``).
    gpus: Sequence[int]
    step: float = 0.5
    data_wait: float = 0.05
    #: Exposed communication per step, per process group.
    groups: Mapping[str, float] = field(default_factory=lambda: {"dp": 0.1})
    batch: int = 32
    #: A rank computing this much longer a step (the others wait in their collective).
    straggler: int | None = None
    straggler_seconds: float = 0.0
    #: Ranks whose client reports a stall from ``stall_from`` (a tick) on: rank → where.
    stalls: Mapping[int, str] = field(default_factory=dict)
    stall_from: int = 0
    stall_until: int = 10**9
    goodput: float | None = 0.8
    #: Fail-slow changes the daemon exported: rank → (part, slowdown ratio).
    fail_slow: Mapping[int, tuple[str, float]] = field(default_factory=dict)


@dataclass
class SimulatedNode:
    jobs: Sequence[SimulatedJob]
    #: GPUs held by a process that reports no steps: gpu → pid.
    holders: Mapping[int, int] = field(default_factory=dict)
    ticks: int = 0
    _totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def wall(self) -> float:
        return WALL + self.ticks * TICK

    def tick(self) -> str:
        """Advance one tick; the exposition text at its end."""
        self.ticks += 1
        lines: list[str] = []
        wall = self.wall()

        def add(name: str, increase: float, **labels: str) -> None:
            key = (name, tuple(sorted(labels.items())))
            self._totals[key] = self._totals.get(key, 0.0) + increase
            lines.append(_line(name, self._totals[key], labels))

        for job in self.jobs:
            for rank, gpu in enumerate(job.gpus):
                key = {"job": job.name, "rank": str(rank)}
                lines.append(_line("trainmon_training_rank_info", 1.0,
                                   {**key, "gpu": str(gpu), "pid": str(4000 + gpu)}))
                stalled = (rank in job.stalls
                           and job.stall_from <= self.ticks < job.stall_until)
                # every rank's step takes the straggler's longer compute: the others wait
                waited = 0.0 if rank == job.straggler else job.straggler_seconds
                step = job.step + job.straggler_seconds
                steps = 0.0 if stalled else TICK / step
                groups = {group: seconds + (waited if group == "dp" else 0.0)
                          for group, seconds in job.groups.items()}
                add("trainmon_training_step_seconds_count", steps, **key)
                add("trainmon_training_step_seconds_sum", steps * step, **key)
                add("trainmon_training_data_wait_seconds_total", steps * job.data_wait, **key)
                add("trainmon_training_comm_seconds_total", steps * sum(groups.values()), **key)
                add("trainmon_training_comm_exposed_seconds_total",
                    steps * sum(groups.values()), **key)
                for group, seconds in groups.items():
                    add("trainmon_training_group_comm_exposed_seconds_total", steps * seconds,
                        **key, group=group)
                add("trainmon_training_samples_total", steps * job.batch, **key)
                lines.append(_line("trainmon_training_last_report_timestamp_seconds", wall, key))
                since = WALL + job.stall_from * TICK
                lines.append(_line("trainmon_training_last_step_timestamp_seconds",
                                   since if stalled else wall, key))
                if stalled:
                    lines.append(_line("trainmon_training_stall_info", 1.0, {
                        **key, "where": job.stalls[rank], "phase": "", "collective": "",
                        "seq": "", "frame": "loader.py:12 next", "group": ""}))
                    lines.append(_line("trainmon_training_stall_start_timestamp_seconds",
                                       since, key))
                lines += _gpu_lines(gpu, 0.95, 0.7)
            for rank, (part, ratio) in job.fail_slow.items():
                key = {"job": job.name, "rank": str(rank)}
                lines.append(_line("trainmon_diagnosis_finding_info", 1.0, {
                    **key, "finding": "fail_slow", "kind": "compute"}))
                lines.append(_line("trainmon_diagnosis_fail_slow_ratio", ratio, {
                    **key, "part": part, "cause": ""}))
                lines.append(_line("trainmon_diagnosis_fail_slow_start_timestamp_seconds",
                                   WALL, key))
            if job.goodput is not None:
                lines.append(_line("trainmon_job_goodput_ratio", job.goodput, {"job": job.name}))
        for gpu, pid in self.holders.items():
            lines += _gpu_lines(gpu, 0.0, 0.0)
            lines.append(_line("trainmon_gpu_process_info", 1.0, {
                "gpu": str(gpu), "pid": str(pid), "pod": "", "namespace": "", "container": "",
                "slurm_job": "", "pod_uid": ""}))
        return "\n".join(lines) + "\n"


def _gpu_lines(gpu: int, utilization: float, sm_active: float) -> list[str]:
    labels = {"gpu": str(gpu)}
    return [_line("trainmon_gpu_utilization_ratio", utilization, labels),
            _line("trainmon_gpu_sm_active_ratio", sm_active, labels),
            _line("trainmon_gpu_memory_used_bytes", 60e9, labels),
            _line("trainmon_gpu_memory_total_bytes", 80e9, labels)]


def _line(name: str, value: float, labels: Mapping[str, str]) -> str:
    text = ",".join('{}="{}"'.format(key, str(value).replace("\\", "\\\\")
                                     .replace('"', '\\"').replace("\n", "\\n"))
                    for key, value in labels.items())
    return f"{name}{{{text}}} {value!r}"


def view(node: SimulatedNode, ticks: int = 8, recorder: Recorder | None = None) -> TopView:
    """The view after ``ticks`` more ticks of ``node``, each read as ``top`` reads it."""
    recorder = recorder or Recorder(DiagnosisConfig(), {"kind": "url", "url": "test"})
    shown = recorder.view(SOURCE)
    for _ in range(ticks):  # a view each tick, as top's refresh: the marks seen are kept
        text = node.tick()
        recorder.add(ScrapedSamples.from_text(text, node.wall(), node.wall(), TOP_SAMPLES))
        shown = recorder.view(SOURCE)
    return shown


def demo_like() -> SimulatedNode:
    """Two jobs as the demo's: ``starved`` (rank 1 hangs in its loader, the others too)
    and ``healthy`` (rank 3 a straggler, groups dp and tp); pid 900 holds GPU 7 idle."""
    return SimulatedNode([
        SimulatedJob("starved", gpus=[0, 1, 2], data_wait=0.2,
                     stalls={0: "data_loader", 1: "data_loader", 2: "data_loader"},
                     stall_from=3, goodput=0.45),
        SimulatedJob("healthy", gpus=[3, 4, 5, 6], groups={"dp": 0.08, "tp": 0.02},
                     straggler=3, straggler_seconds=0.2, goodput=0.77),
    ], holders={7: 900})


TMUX = shutil.which("tmux") or "/usr/bin/tmux"


class Tmux:
    """A detached tmux session, alone on a server of its own whose socket is ``socket``
    (a test's folder: gone with it)."""

    def __init__(self, command: Sequence[str], width: int, height: int, socket: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.socket = socket
        exports = [f"{key}={value}" for key, value in (env or {}).items()]
        self.run("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height),
                 "env", *exports, *command)

    def run(self, *args: str) -> str:
        return subprocess.run([TMUX, "-S", str(self.socket), *args], check=True,
                              capture_output=True, text=True, timeout=10).stdout

    def alive(self) -> bool:
        return subprocess.run([TMUX, "-S", str(self.socket), "has-session", "-t", "top"],
                              capture_output=True, timeout=10).returncode == 0

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "top", *keys)

    def resize(self, width: int, height: int) -> None:
        self.run("resize-window", "-t", "top", "-x", str(width), "-y", str(height))

    def wait_for(self, condition: Callable[[str], bool], what: str,
                 timeout: float = 20.0) -> str:
        """The screen once ``condition`` holds for it; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"top exited while waiting for {what}:\n{screen}")
            screen = self.screen()
            if condition(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{screen}")

    def wait_closed(self, what: str, timeout: float = 10.0) -> None:
        """Until the command has exited (its session with it)."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n"
                                     f"{self.screen()}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([TMUX, "-S", str(self.socket), "kill-server"], capture_output=True,
                       timeout=10)
