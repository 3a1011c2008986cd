"""Launching the labelled parallel jobs of ``testkit.parallel_job`` against a daemon.

The diagnosis tests and ``bench/diagnosis_score.py`` start a job of a known kind with a
known fault and ask the daemon what it sees::

    spec = JobSpec("fsdp2_tp", "hang_loader", fault_at=5.0)
    with launch(spec, f"unix://{socket}", tmp_path) as job:
        ...                      # scrape the daemon; job.fault_time is when the hang began
    # stop(): the hang released, the ranks ended, the namespaces gone

``launch`` starts one process per rank (``python -m testkit.parallel_job``) in the
environment ``torchrun`` gives its workers (``RANK``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
``TORCHELASTIC_RUN_ID=none`` as without ``--rdzv-id``), reporting to ``endpoint`` as
``TRAINMON_JOB=spec.job_name``. What a job leaves goes to ``workdir/<job name>/``: each
rank's log (``rank-N.log``, see ``RunningJob.logs``), its truth (``truth-N.json``, see
``RunningJob.truth``), the marker files the ranks write at their first step and when
their fault begins (``markers/``), the release file of the hangs and the checkpoints
(removed by ``stop()``).

Placement: every rank on loopback, except for the ``communication`` fault, whose first
half of ranks runs in one network namespace and the rest in another, joined by a veth
pair shaped to ``LINK_RATE`` both ways (``testkit.netns``): a 2-node job over a slow NIC,
ranks of one node talking over the node's own loopback. Without namespaces
(``testkit.netns.unavailable_reason``) ``launch`` raises ``NamespacesUnavailable``, for
the caller to skip on. The daemon's unix socket is a filesystem path, which the ranks
inside the namespaces reach as well.

``sigstop``/``kill``: the job runs healthy; a launcher thread sends ``SIGSTOP``/``SIGKILL``
to the fault rank ``fault_at`` seconds after that rank's first step (its marker file).

This module imports no torch (the rank script imports its tables from here).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from testkit.daemon import free_port
from testkit.netns import NetworkLab, VethLink, unavailable_reason

REPO = Path(__file__).resolve().parents[1]

#: The kinds of job, each with its world size.
WORLD_SIZES = {"ddp": 2, "fsdp2": 2, "fsdp2_tp": 4, "pipeline": 2, "lightning": 2}
KINDS: tuple[str, ...] = tuple(WORLD_SIZES)
#: Faults that the rank script itself makes: rank ``fault_at`` s after its first step
#: blocks (until the release file exists, or the job's ``--timeout``).
HANGS: tuple[str, ...] = ("hang_loader", "hang_collective", "hang_lock", "hang_checkpoint")
#: Faults that the launcher makes, with the signal it sends to the fault rank.
SIGNALS = {"sigstop": signal.SIGSTOP, "kill": signal.SIGKILL}
FAULTS: tuple[str, ...] = ("healthy", "storage", "communication", "slow_rank", *HANGS,
                           *SIGNALS)
#: Healthy things a job may do besides its fault (any combination).
CONFOUNDERS: tuple[str, ...] = ("eval", "checkpoint", "warmup", "varlen")
#: Faults a kind cannot make (Lightning writes its checkpoints on rank 0 only).
UNSUPPORTED = {"lightning": ("hang_checkpoint",)}

#: Rate of the ``communication`` job's link between its two namespaces, both ways.
LINK_RATE = "300mbit"
LINK_CIDRS = ("10.203.0.1/24", "10.203.0.2/24")
#: Longest wait for the fault rank's first step before a signal fault is given up.
FIRST_STEP_TIMEOUT_SECONDS = 300.0
#: How long ``stop()`` lets the ranks end on SIGTERM before it kills them.
STOP_GRACE_SECONDS = 5.0
#: How much of each rank's log ``logs()`` shows.
LOG_TAIL_CHARACTERS = 6000

_link_numbers = itertools.count(1)


class NamespacesUnavailable(RuntimeError):
    """A ``communication`` job needs network namespaces, which this machine cannot make
    (root, ``ip`` and ``tc``); the message says why (a skip reason)."""


def world_size(kind: str) -> int:
    """Ranks of a job of ``kind``."""
    if kind not in WORLD_SIZES:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return WORLD_SIZES[kind]


def supported_faults(kind: str) -> tuple[str, ...]:
    """The faults a job of ``kind`` can have."""
    world_size(kind)
    return tuple(fault for fault in FAULTS if fault not in UNSUPPORTED.get(kind, ()))


def check_job(kind: str, fault: str, confounders: tuple[str, ...]) -> None:
    """``ValueError`` naming what is allowed, for a kind, fault or confounder that is not."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    if fault not in supported_faults(kind):
        raise ValueError(f"a {kind} job cannot have the fault {fault!r}; its faults: "
                         f"{', '.join(supported_faults(kind))}")
    unknown = sorted(set(confounders) - set(CONFOUNDERS))
    if unknown:
        raise ValueError(f"unknown confounder {unknown[0]!r}; expected some of "
                         f"{', '.join(CONFOUNDERS)}")


@dataclass(frozen=True)
class JobSpec:
    """One labelled job: its kind, its fault (on ``fault_rank``, ``fault_at`` seconds after
    that rank's first step) and the healthy confounders it has besides.
    ``extra_args`` go to the rank script after the launcher's own options."""

    kind: str
    fault: str = "healthy"
    job: str = ""
    fault_rank: int | None = None
    fault_at: float = 20.0
    confounders: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_job(self.kind, self.fault, self.confounders)
        ranks = world_size(self.kind)
        if self.fault_rank is not None and not 0 <= self.fault_rank < ranks:
            raise ValueError(f"fault_rank {self.fault_rank} is not a rank of a {self.kind} "
                             f"job (0 to {ranks - 1})")

    @property
    def job_name(self) -> str:
        """``TRAINMON_JOB`` of the ranks: ``job``, else ``<kind>-<fault>``."""
        return self.job or f"{self.kind}-{self.fault}"

    @property
    def rank_at_fault(self) -> int:
        """``fault_rank``, else the last rank."""
        return world_size(self.kind) - 1 if self.fault_rank is None else self.fault_rank


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: the command prefix (``ip netns exec …`` or nothing), its
    node (the namespace's index) and the interface gloo uses."""

    prefix: tuple[str, ...]
    node: int
    interface: str


class RunningJob:
    """The rank processes of a launched job; a context manager whose exit is ``stop()``."""

    def __init__(self, spec: JobSpec, folder: Path, lab: NetworkLab | None) -> None:
        self.spec = spec
        self.folder = folder
        self.release = folder / "release"
        self.markers = folder / "markers"
        self.checkpoints = folder / "checkpoints"
        self.started = 0.0
        self._processes: list[subprocess.Popen[bytes]] = []
        self._log_files: list[IO[bytes]] = []
        self._lab = lab  # the lab this job made for itself, closed by stop()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stopped = False
        self._signal_time: float | None = None
        self._signaller: threading.Thread | None = None

    @property
    def pids(self) -> tuple[int, ...]:
        """The process id of each rank, by rank."""
        return tuple(process.pid for process in self._processes)

    @property
    def fault_time(self) -> float | None:
        """Unix time the fault began: when the launcher sent its signal (``sigstop``,
        ``kill``), when the rank's hang began (its marker file), else None."""
        if self.spec.fault in SIGNALS:
            return self._signal_time
        if self.spec.fault in HANGS:
            return read_marker(self.markers, self.spec.rank_at_fault, "fault")
        return None

    def first_step_time(self, rank: int) -> float | None:
        """Unix time ``rank`` ended its first step, None before."""
        return read_marker(self.markers, rank, "first-step")

    def alive(self) -> bool:
        """Whether every rank's process still runs (a stopped one counts as running)."""
        return bool(self._processes) and all(p.poll() is None for p in self._processes)

    def wait(self, timeout: float) -> tuple[int | None, ...]:
        """Wait at most ``timeout`` seconds in all for every rank to exit (a job of
        ``--steps`` steps ends by itself); each rank's exit status, None for a rank
        still running then."""
        deadline = time.monotonic() + timeout
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        return tuple(process.poll() for process in self._processes)

    def logs(self) -> str:
        """The end of each rank's log, with its exit status: for failure messages."""
        parts = []
        for rank, process in enumerate(self._processes):
            path = self.folder / f"rank-{rank}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {self.spec.job_name} rank {rank} (pid {process.pid}, "
                         f"exit {process.poll()}) ---\n{text[-LOG_TAIL_CHARACTERS:]}")
        return "\n".join(parts)

    def truth(self) -> list[dict[str, Any]]:
        """Each rank's own account (``--result``; rewritten every second while it runs):
        steps, seconds in steps and in data wait, first-step and fault times, and what the
        run ledger's rates are held to (samples, data-parallel replica, reporter and loop
        times, step durations: ``testkit.parallel_job``'s docstring). An empty dict for a
        rank that has written none yet."""
        truths: list[dict[str, Any]] = []
        for rank in range(len(self._processes)):
            try:
                truths.append(json.loads((self.folder / f"truth-{rank}.json").read_text()))
            except (OSError, ValueError):
                truths.append({})
        return truths

    def stop(self) -> None:
        """Release the hangs, continue a stopped rank, end every rank (SIGTERM, SIGKILL
        after ``STOP_GRACE_SECONDS``) and remove the checkpoints and the namespaces this
        job made. Idempotent; returns within about twice the grace."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stopping.set()
        with contextlib.suppress(OSError):
            self.release.touch()
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in self._processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_GRACE_SECONDS)
        if self._signaller is not None:
            self._signaller.join(STOP_GRACE_SECONDS)
        for log in self._log_files:
            log.close()
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        if self._lab is not None:
            self._lab.close()

    def __enter__(self) -> RunningJob:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _start(self, endpoint: str, placements: list[Placement], master_addr: str,
               env: Mapping[str, str]) -> None:
        spec = self.spec
        ranks = len(placements)
        per_node = ranks // (1 + max(placement.node for placement in placements))
        common = {
            **os.environ, **env,
            "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(per_node),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(free_port()),
            "TORCHELASTIC_RUN_ID": "none", "OMP_NUM_THREADS": "1",
            "TRAINMON_ENDPOINT": endpoint, "TRAINMON_JOB": spec.job_name,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        options = ["--fault-rank", str(spec.rank_at_fault), "--fault-at", str(spec.fault_at),
                   "--release", str(self.release), "--markers", str(self.markers),
                   "--output", str(self.checkpoints)]
        if spec.confounders:
            options += ["--confounders", ",".join(spec.confounders)]
        self.started = time.time()
        for rank, placement in enumerate(placements):
            log = (self.folder / f"rank-{rank}.log").open("wb")
            self._log_files.append(log)
            rank_env = {**common, "RANK": str(rank), "ROLE_RANK": str(rank),
                        "LOCAL_RANK": str(rank % per_node), "GROUP_RANK": str(placement.node),
                        "GLOO_SOCKET_IFNAME": placement.interface}
            self._processes.append(subprocess.Popen(
                [*placement.prefix, sys.executable, "-m", "testkit.parallel_job", spec.kind,
                 spec.fault, *options, "--result", str(self.folder / f"truth-{rank}.json"),
                 *spec.extra_args],
                cwd=REPO, env=rank_env, stdout=log, stderr=subprocess.STDOUT))
        if spec.fault in SIGNALS:
            self._signaller = threading.Thread(
                target=self._signal_after_first_step, name=f"{spec.job_name}-signal",
                daemon=True)
            self._signaller.start()

    def _signal_after_first_step(self) -> None:
        """Send the fault's signal to the fault rank ``fault_at`` s after its first step;
        nothing if the job stops, the rank exits or never steps (bounded)."""
        rank = self.spec.rank_at_fault
        process = self._processes[rank]
        deadline = time.monotonic() + FIRST_STEP_TIMEOUT_SECONDS
        first = self.first_step_time(rank)
        while first is None:
            if self._stopping.wait(0.1) or process.poll() is not None \
                    or time.monotonic() > deadline:
                return
            first = self.first_step_time(rank)
        if self._stopping.wait(max(0.0, first + self.spec.fault_at - time.time())):
            return
        with self._lock:
            if self._stopped or process.poll() is not None:
                return
            os.kill(process.pid, SIGNALS[self.spec.fault])
            self._signal_time = time.time()


def read_marker(markers: Path, rank: int, name: str) -> float | None:
    """The Unix time in marker file ``rank-<rank>.<name>`` (``parallel_job.Markers``),
    None while there is none."""
    try:
        return float((markers / f"rank-{rank}.{name}").read_text())
    except (OSError, ValueError):
        return None


def shaped_link(lab: NetworkLab) -> VethLink:
    """Two new namespaces of ``lab`` joined by a veth pair shaped to ``LINK_RATE`` both
    ways."""
    number = next(_link_numbers)
    link = lab.veth(lab.namespace(f"p{number}a"), lab.namespace(f"p{number}b"), *LINK_CIDRS)
    for namespace, interface in ((link.namespace_a, link.interface_a),
                                 (link.namespace_b, link.interface_b)):
        lab.shape(namespace, interface, rate=LINK_RATE)
    return link


def launch(spec: JobSpec, endpoint: str, workdir: Path, *, lab: NetworkLab | None = None,
           env: Mapping[str, str] | None = None) -> RunningJob:
    """Start the ranks of ``spec`` reporting to ``endpoint`` (``unix:///path``), their
    files in ``workdir/<job name>/``. ``lab``: where a ``communication`` job makes its
    namespaces (its owner removes them); without one the job makes its own lab and its
    ``stop()`` removes it. ``env``: more variables for every rank (the launcher's own win).
    ``NamespacesUnavailable`` for a ``communication`` job where no namespace can be made."""
    folder = Path(workdir) / spec.job_name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "markers", ignore_errors=True)  # of an earlier job of this name
    for stale in (folder / "release", *folder.glob("truth-*.json")):
        stale.unlink(missing_ok=True)
    ranks = world_size(spec.kind)
    own_lab: NetworkLab | None = None
    if spec.fault != "communication":
        placements = [Placement((), 0, "lo")] * ranks
        master = "127.0.0.1"
    else:
        if lab is None:
            reason = unavailable_reason()
            if reason:
                raise NamespacesUnavailable(reason)
            lab = own_lab = NetworkLab("par")
        try:
            link = shaped_link(lab)
        except BaseException:
            if own_lab is not None:
                own_lab.close()
            raise
        half = ranks // 2
        placements = [
            Placement(tuple(NetworkLab.exec_in(link.namespace_a, [])), 0, link.interface_a)
            if rank < half else
            Placement(tuple(NetworkLab.exec_in(link.namespace_b, [])), 1, link.interface_b)
            for rank in range(ranks)]
        master = link.address_a
    job = RunningJob(spec, folder, own_lab)
    try:
        job._start(endpoint, placements, master, env or {})
    except BaseException:
        job.stop()
        raise
    return job
