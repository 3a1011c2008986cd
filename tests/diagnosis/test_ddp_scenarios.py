"""Real 2-rank DDP jobs (gloo, CPU) against a real daemon: each bottleneck is named.

The problems a user measured with jobs integrated as the README says, and
instrumented with ``reporter.instrument(ddp_model)`` (``testkit/ddp_job.py``):

=================  ==============================================  ===============
job                what happens every step                         verdict
=================  ==============================================  ===============
ddp-comm           21 MB gradient all-reduce between two network   communication
                   namespaces over a veth shaped to 300 Mbit/s
                   (about 0.55 s of a 0.6 s step)
ddp-slow-rank      rank 1 has ten times rank 0's extra device      scheduling,
                   time; rank 0 waits for it in the all-reduce      straggler rank 1
ddp-storage        the Dataset sleeps 20 ms per sample             storage
ddp-healthy        device time only, loopback all-reduce           compute
=================  ==============================================  ===============

Without ``instrument`` the daemon said compute for the first two. The four
jobs run at once on one daemon (their steps mostly wait, so two CPU cores
carry them) whose diagnosis window is shortened to ``WINDOW_SECONDS``; a
thread scrapes it every second (each scrape is a diagnosis snapshot, as
with Prometheus) and keeps the scrapes; each test waits, within ``VERDICT_DEADLINE_SECONDS`` of
its job's start, for the daemon's ``trainmon_bottleneck`` to hold its verdict
on several consecutive scrapes, then checks the findings and ``trainmon
doctor --url … --json``. The ranks reach the daemon through its unix socket,
a filesystem path, which works from inside network namespaces too. Only the
communication job needs namespaces (root, ``ip``, ``tc``); without them that
test alone is skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.daemon import Daemon, free_port, trainmon_command
from testkit.daemon import serve as serve_daemon
from testkit.ddp_job import SCENARIOS, parameter_count
from testkit.exposition import Scrape, parse
from testkit.netns import NetworkLab, VethLink, unavailable_reason
from tests.diagnosis.diagnosis_support import RankProcesses, job_verdicts
from trainmon import contract

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The daemon's diagnosis window (collectors.diagnosis.window_seconds; 60 by default).
WINDOW_SECONDS = 15
#: A verdict must be there this long after its job's processes started.
VERDICT_DEADLINE_SECONDS = 120.0
#: ... and hold on this many consecutive scrapes, a second apart.
STABLE_SCRAPES = 4
#: Steps per job: far more than the tests need; the fixture ends the jobs.
JOB_STEPS = 2000
#: The communication job's link: rate on both ends of the veth pair.
LINK_RATE = "300mbit"
LINK_BYTES_PER_SECOND = 300e6 / 8
NAMESPACE_CIDRS = ("10.203.0.1/24", "10.203.0.2/24")
NAMESPACE_MASTER_PORT = 29500
#: How often the test scrapes the daemon (each scrape is a diagnosis snapshot).
SCRAPE_INTERVAL_SECONDS = 1.0
DOCTOR_SECONDS = 6

JOBS = {
    "communication": "ddp-comm",
    "slow-rank": "ddp-slow-rank",
    "storage": "ddp-storage",
    "healthy": "ddp-healthy",
}


class Scraper:
    """Scrapes the daemon every ``SCRAPE_INTERVAL_SECONDS`` on a thread (as Prometheus
    would; the diagnosis takes a snapshot per scrape) and keeps every scrape."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._lock = threading.Lock()
        self._history: list[tuple[float, Scrape]] = []
        self._error: str | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddp-scraper", daemon=True)
        self._thread.start()

    def history(self) -> list[tuple[float, Scrape]]:
        """(monotonic time, scrape) of every scrape so far; fails if scraping failed."""
        with self._lock:
            assert self._error is None, self._error
            return list(self._history)

    def latest(self) -> Scrape:
        history = self.history()
        return history[-1][1] if history else parse(self.daemon.metrics())

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(SCRAPE_INTERVAL_SECONDS + 15)

    def _run(self) -> None:
        while not self._stopping.wait(SCRAPE_INTERVAL_SECONDS):
            try:
                scrape = parse(self.daemon.metrics())
            except (OSError, AssertionError) as error:
                with self._lock:
                    self._error = f"cannot scrape the daemon: {error}\n{self.daemon.log()}"
                return
            with self._lock:
                self._history.append((time.monotonic(), scrape))


@dataclass
class Node:
    """The daemon, the running jobs and, when namespaces are available, the shaped link."""

    daemon: Daemon
    scraper: Scraper
    jobs: dict[str, RankProcesses]
    link: VethLink | None
    lab: NetworkLab | None
    no_namespaces: str | None


def serve(directory: Path, config: Mapping[str, object]) -> Daemon:
    """``trainmon serve`` on a free loopback port with ``config`` (as ``start_daemon``,
    which is per test: these jobs are shared by the module's tests)."""
    config_path = directory / "trainmon.yml"
    config_path.write_text(yaml.safe_dump(dict(config)))
    log_path = directory / "trainmon.log"
    return serve_daemon(config_path, log_path, state_directory=log_path.parent)


def start_job(directory: Path, scenario: str, socket: Path,
              ranks: list[tuple[list[str], Mapping[str, str]]]) -> RankProcesses:
    """Start one process per rank: ``ranks`` gives each one's command prefix
    (``ip netns exec …`` or nothing) and its distributed environment."""
    job = RankProcesses(JOBS[scenario], time.monotonic())
    for rank, (prefix, rank_env) in enumerate(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(len(ranks)),
            "TRAINMON_ENDPOINT": f"unix://{socket}",
            "TRAINMON_JOB": job.name,
            "PYTHONPATH": os.pathsep.join(
                [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **rank_env,
        }
        log = directory / f"{job.name}-{rank}.log"
        job.logs.append(log)
        job.processes.append(subprocess.Popen(
            [*prefix, sys.executable, "-m", "testkit.ddp_job", "scenario", scenario,
             "--steps", str(JOB_STEPS)],
            cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        ))
    return job


def loopback_ranks() -> list[tuple[list[str], Mapping[str, str]]]:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "GLOO_SOCKET_IFNAME": "lo"}
    return [([], env), ([], env)]


def namespace_ranks(lab: NetworkLab, link: VethLink) -> list[tuple[list[str], Mapping[str, str]]]:
    """Rank 0 in namespace A (the master), rank 1 in B, gloo on the veth ends."""
    master = {"MASTER_ADDR": link.address_a, "MASTER_PORT": str(NAMESPACE_MASTER_PORT)}
    return [
        (lab.exec_in(link.namespace_a, []), {**master, "GLOO_SOCKET_IFNAME": link.interface_a}),
        (lab.exec_in(link.namespace_b, []), {**master, "GLOO_SOCKET_IFNAME": link.interface_b}),
    ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    directory = tmp_path_factory.mktemp("ddp")
    socket = directory / "steps.sock"
    with ExitStack() as cleanup:  # jobs end first, then the link goes, then the daemon
        daemon = serve(directory, {"collectors": {
            "training": {"socket": str(socket)},
            "diagnosis": {"window_seconds": WINDOW_SECONDS},
        }})
        cleanup.callback(daemon.stop)
        scraper = Scraper(daemon)
        cleanup.callback(scraper.stop)
        no_namespaces = unavailable_reason()
        lab = link = None
        if no_namespaces is None:
            lab = cleanup.enter_context(NetworkLab("ddp"))
            link = lab.veth(lab.namespace("a"), lab.namespace("b"), *NAMESPACE_CIDRS)
            lab.shape(link.namespace_a, link.interface_a, rate=LINK_RATE)
            lab.shape(link.namespace_b, link.interface_b, rate=LINK_RATE)
        jobs: dict[str, RankProcesses] = {}
        for scenario in JOBS:
            if scenario == "communication":
                if lab is None or link is None:
                    continue
                ranks = namespace_ranks(lab, link)
            else:
                ranks = loopback_ranks()
            jobs[scenario] = start_job(directory, scenario, socket, ranks)
            cleanup.callback(jobs[scenario].stop)
        yield Node(daemon, scraper, jobs, link, lab, no_namespaces)


def first_stable(history: list[tuple[float, Scrape]], job: str, kind: str) -> int | None:
    """Index of the first scrape that starts ``STABLE_SCRAPES`` consecutive scrapes
    with the job's verdict ``kind``, or None."""
    streak = 0
    for index, (_, scrape) in enumerate(history):
        streak = streak + 1 if job_verdicts(scrape).get(job) == kind else 0
        if streak >= STABLE_SCRAPES:
            return index - STABLE_SCRAPES + 1
    return None


def wait_for_verdict(node: Node, scenario: str, kind: str) -> tuple[Scrape, float]:
    """Wait until the job's verdict is ``kind`` on ``STABLE_SCRAPES`` consecutive
    scrapes, the first of them within ``VERDICT_DEADLINE_SECONDS`` of the job's
    start; the latest scrape and the seconds from the start to that first one."""
    job = node.jobs[scenario]
    deadline = job.started + VERDICT_DEADLINE_SECONDS
    give_up = deadline + (STABLE_SCRAPES + 2) * SCRAPE_INTERVAL_SECONDS
    while True:
        failure = job.failed()
        assert failure is None, failure
        history = node.scraper.history()
        first = first_stable(history, job.name, kind)
        if first is not None:
            seconds = history[first][0] - job.started
            assert seconds <= VERDICT_DEADLINE_SECONDS, (
                f"{job.name}: {kind} only after {seconds:.0f} s")
            return history[-1][1], seconds
        if time.monotonic() >= give_up:
            scrape = node.scraper.latest()
            raise AssertionError(
                f"{job.name}: no stable {kind} verdict within {VERDICT_DEADLINE_SECONDS:.0f} s "
                f"of its start\n{evidence(scrape, job.name)}")
        time.sleep(0.5)


def evidence(scrape: Scrape, job: str) -> str:
    """The job's training series and diagnosis gauges, for failure messages."""
    lines = []
    for name, series in sorted(scrape.samples.items()):
        if name.startswith(("trainmon_training_", "trainmon_diagnosis_", "trainmon_bottleneck")):
            for sample_labels, value in sorted(series.items()):
                if dict(sample_labels).get("job") == job and "le" not in dict(sample_labels):
                    lines.append(f"  {name}{dict(sample_labels)} {value:g}")
    return "\n".join(lines) or f"  no series of {job}"


def findings(scrape: Scrape, job: str) -> list[dict[str, str]]:
    """Label sets of the job's ``trainmon_diagnosis_finding_info`` series."""
    return [labels for labels in scrape.labelsets("trainmon_diagnosis_finding_info")
            if labels["job"] == job]


def per_rank(scrape: Scrape, name: str, job: str) -> dict[str, float]:
    return {labels["rank"]: scrape.samples[name][tuple(sorted(labels.items()))]
            for labels in scrape.labelsets(name) if labels["job"] == job}


def doctor_verdict(node: Node, job: str) -> dict[str, Any]:
    """The job's entry in ``trainmon doctor --url … --json`` (daemon thresholds)."""
    result = subprocess.run(
        [*trainmon_command(), "doctor", "--url", node.daemon.url, "--seconds",
         str(DOCTOR_SECONDS), "--json", "--config", str(node.daemon.config_path)],
        capture_output=True, text=True, timeout=DOCTOR_SECONDS + 60, check=False,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert result.stdout.strip(), result.stderr  # a traceback also exits 1
    report = json.loads(result.stdout)
    assert report["exit_code"] == result.returncode and report["source"]["kind"] == "url"
    verdicts = {entry["job"]: entry for entry in report["jobs"]}
    assert job in verdicts, result.stdout
    return dict(verdicts[job])


def test_gradient_allreduce_over_a_slow_link_is_communication(node: Node) -> None:
    if "communication" not in node.jobs:
        pytest.skip(node.no_namespaces or "no communication job")
    job = node.jobs["communication"]
    scrape, seconds = wait_for_verdict(node, "communication", "communication")
    print(f"{job.name}: communication after {seconds:.1f} s")
    codes = {(f["kind"], f["finding"]) for f in findings(scrape, job.name)}
    assert ("communication", "comm_exposed") in codes, evidence(scrape, job.name)
    assert "scheduling" not in {kind for kind, _ in codes}, evidence(scrape, job.name)
    comm_ratio = scrape.value("trainmon_diagnosis_comm_ratio", job=job.name)
    assert comm_ratio is not None and comm_ratio >= contract.COMM_RATIO, evidence(scrape, job.name)

    # The instrumentation measured the gradients: about 4 bytes per parameter per step.
    steps = per_rank(scrape, "trainmon_training_steps_total", job.name)
    sent = per_rank(scrape, "trainmon_training_comm_bytes_total", job.name)
    exposed = per_rank(scrape, "trainmon_training_comm_exposed_seconds_total", job.name)
    gradient_bytes = 4 * parameter_count(SCENARIOS["communication"])
    assert sorted(steps) == sorted(sent) == sorted(exposed) == ["0", "1"]
    for rank in steps:
        assert sent[rank] / steps[rank] >= 0.9 * gradient_bytes, evidence(scrape, job.name)
        assert exposed[rank] > 0

    # ... and they did cross the shaped link (tbf counts what it sent), both ways.
    assert node.lab is not None and node.link is not None
    link = node.link
    for namespace, interface in ((link.namespace_a, link.interface_a),
                                 (link.namespace_b, link.interface_b)):
        statistics = node.lab.qdiscs(namespace, interface)
        assert "tbf" in statistics, statistics
        through = int(re.search(r"Sent (\d+) bytes", statistics).group(1))  # type: ignore[union-attr]
        assert through >= 0.5 * gradient_bytes * min(steps.values()), statistics

    verdict = doctor_verdict(node, job.name)
    assert (verdict["kind"], verdict["findings"][0]["code"]) == (
        "communication", "comm_exposed"), verdict
    found = verdict["evidence"]
    print(f"{job.name}: doctor comm_ratio {found['comm_ratio']:.2f}, "
          f"{found['comm_bytes_per_second'] / 1e6:.1f} MB/s in flight")
    assert found["comm_ratio"] >= contract.COMM_RATIO, verdict
    assert found["comm_source"] == "measured", verdict
    # the gradients' bytes over the time in flight: the shaped link's rate, roughly
    assert 0.25 * LINK_BYTES_PER_SECOND <= found["comm_bytes_per_second"] \
        <= 1.25 * LINK_BYTES_PER_SECOND, verdict
    assert "NCCL" in verdict["advice"]


def test_a_slow_rank_is_a_straggler_named_by_doctor(node: Node) -> None:
    job = node.jobs["slow-rank"]
    scrape, seconds = wait_for_verdict(node, "slow-rank", "scheduling")
    print(f"{job.name}: scheduling after {seconds:.1f} s")
    assert "straggler" in {f["finding"] for f in findings(scrape, job.name)}
    ratio = scrape.value("trainmon_diagnosis_straggler_ratio", job=job.name)
    assert ratio is not None and ratio >= contract.STRAGGLER_FACTOR, evidence(scrape, job.name)
    # rank 0 waits for rank 1 inside the all-reduce: exposed comm on the fast rank
    exposed = per_rank(scrape, "trainmon_training_comm_exposed_seconds_total", job.name)
    assert exposed["0"] > 2 * exposed["1"], evidence(scrape, job.name)

    verdict = doctor_verdict(node, job.name)
    assert verdict["kind"] == "scheduling", verdict
    assert verdict["findings"][0]["code"] == "straggler", verdict
    assert verdict["findings"][0]["values"]["rank"] == "1", verdict
    assert verdict["evidence"]["straggler_rank"] == "1", verdict


def test_the_daemon_names_the_straggler_rank(node: Node) -> None:
    job = node.jobs["slow-rank"]
    scrape, _ = wait_for_verdict(node, "slow-rank", "scheduling")
    stragglers = [f for f in findings(scrape, job.name) if f["finding"] == "straggler"]
    assert [f.get("rank") for f in stragglers] == ["1"], stragglers


def test_the_wait_for_a_straggler_is_not_communication(node: Node) -> None:
    """The fast rank's wait for rank 1 is exposed comm, but the link is idle:
    no communication finding, neither in the daemon nor in doctor."""
    job = node.jobs["slow-rank"]
    scrape, _ = wait_for_verdict(node, "slow-rank", "scheduling")
    assert "communication" not in {f["kind"] for f in findings(scrape, job.name)}, (
        evidence(scrape, job.name))
    verdict = doctor_verdict(node, job.name)
    assert "communication" not in {f["kind"] for f in verdict["findings"]}, verdict


def test_a_dataset_that_sleeps_is_storage(node: Node) -> None:
    job = node.jobs["storage"]
    scrape, seconds = wait_for_verdict(node, "storage", "storage")
    print(f"{job.name}: storage after {seconds:.1f} s")
    assert findings(scrape, job.name)[0]["finding"] == "data_wait"
    wait = scrape.value("trainmon_diagnosis_data_wait_ratio", job=job.name)
    assert wait is not None and wait >= contract.DATA_WAIT_RATIO, evidence(scrape, job.name)

    verdict = doctor_verdict(node, job.name)
    assert (verdict["kind"], verdict["findings"][0]["code"]) == ("storage", "data_wait"), verdict
    assert "num_workers" in verdict["advice"]


def test_a_healthy_job_is_neither_communication_nor_scheduling(node: Node) -> None:
    job = node.jobs["healthy"]
    scrape, seconds = wait_for_verdict(node, "healthy", "compute")
    print(f"{job.name}: compute after {seconds:.1f} s")
    # A whole window more; from the job's start on, no scrape shows a communication
    # or scheduling finding, and from its first verdict on every one says compute.
    judged_since = job.started + seconds
    until = judged_since + WINDOW_SECONDS
    while time.monotonic() < until:
        time.sleep(0.5)
    history = node.scraper.history()
    assert sum(judged_since <= at for at, _ in history) >= WINDOW_SECONDS // 2
    for at, scrape in history:
        kinds = {f["kind"] for f in findings(scrape, job.name)}
        assert not kinds & {"communication", "scheduling"}, evidence(scrape, job.name)
        if at >= judged_since:
            assert job_verdicts(scrape).get(job.name) == "compute", evidence(scrape, job.name)
    exposed = per_rank(scrape, "trainmon_training_comm_exposed_seconds_total", job.name)
    assert sorted(exposed) == ["0", "1"], evidence(scrape, job.name)

    verdict = doctor_verdict(node, job.name)
    assert verdict["kind"] == "compute", verdict
    assert not {f["kind"] for f in verdict["findings"]} & {"communication", "scheduling"}
