"""A hung job on a real ``torch.distributed`` job (CPU, gloo, 2 processes): which rank,
and where (issue 27).

``testkit/ddp_job.py hang``: the ``healthy`` scenario under ``Reporter.instrument``,
whose rank 1 Dataset blocks in ``__getitem__`` from step 30 (a read that never returns)
until the test releases it. Rank 0 goes on to its next all-reduce and waits there. Within
60 s of the stall the daemon must name rank 1, in its data loader with its innermost frame
in the dataset code, and show rank 0 waiting in the all-reduce, in the metrics and in
``trainmon doctor --json``; once released, the steps resume and the finding goes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon, trainmon_command
from testkit.exposition import Scrape, parse
from testkit.prometheus import Prometheus, wait_until
from tests.alerts.alerts_support.bundle import rules_path
from tests.diagnosis.diagnosis_support import HANG_JOB as JOB
from tests.diagnosis.diagnosis_support import start_hang_ranks as start_ranks
from tests.diagnosis.diagnosis_support import stop_hang_ranks as stop

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The acceptance's bound, from the stall to its finding.
NAMED_WITHIN_SECONDS = 60.0
END_DEADLINE_SECONDS = 120.0

pytestmark = pytest.mark.integration


def hung_finding(scrape: Scrape) -> dict[str, str] | None:
    return next((labels for labels in scrape.labelsets("trainmon_diagnosis_finding_info")
                 if labels.get("job") == JOB and labels.get("finding") == "hung_rank"), None)


def wait_for(daemon: Daemon, condition: Callable[[Scrape], bool], seconds: float) -> Scrape:
    deadline = time.monotonic() + seconds
    while True:
        scrape = parse(daemon.metrics())
        if condition(scrape):
            return scrape
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.5)


def test_a_rank_blocked_in_its_dataset_is_named_with_its_frame_and_the_other_waiting(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {"training": {"socket": socket}}})
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, socket, release)
    try:
        stalled = wait_for(daemon, lambda s: s.value(
            "trainmon_training_stalled", job=JOB, rank="1") == 1.0, END_DEADLINE_SECONDS)
        started = stalled.value("trainmon_training_stall_start_timestamp_seconds",
                                job=JOB, rank="1")
        assert started is not None
        named = wait_for(daemon, lambda s: hung_finding(s) is not None
                         and any(labels["rank"] == "0" for labels in
                                 s.labelsets("trainmon_training_stall_info")),
                         NAMED_WITHIN_SECONDS)
        assert time.time() - started < NAMED_WITHIN_SECONDS
        where = {labels["rank"]: labels for labels in named.labelsets(
            "trainmon_training_stall_info") if labels["job"] == JOB}
        doctor = subprocess.run(
            [*trainmon_command(), "doctor", "--url", f"http://127.0.0.1:{daemon.port}",
             "--seconds", "3", "--json"], capture_output=True, text=True, timeout=60)
        release.touch()
        resumed = wait_for(daemon, lambda s: s.value(
            "trainmon_training_stalled", job=JOB, rank="1") == 0.0 and hung_finding(s) is None,
            END_DEADLINE_SECONDS)
        for process in ranks:
            assert process.wait(END_DEADLINE_SECONDS) == 0
    finally:
        stop(ranks, release)
    finding = hung_finding(named)
    assert finding is not None and finding["rank"] == "1" and finding["kind"] == "scheduling"
    assert where["1"]["where"] == "data_loader"
    assert where["1"]["frame"].startswith("ddp_job.py:")
    assert where["1"]["frame"].endswith(" __getitem__")
    assert (where["0"]["where"], where["0"]["collective"]) == ("collective", "all_reduce")
    assert int(where["0"]["seq"]) > 0
    report = json.loads(doctor.stdout)
    job = next(job for job in report["jobs"] if job["job"] == JOB)
    hung = next(f for f in job["findings"] if f["code"] == "hung_rank")
    assert hung["values"]["rank"] == "1" and hung["values"]["where"] == "data_loader"
    assert "rank 1 holds the job" in hung["message"] and "__getitem__" in hung["message"]
    assert "all_reduce #" in hung["message"]
    per_rank = hung["values"]["ranks"]
    # the collective with its process group: DDP's is the data-parallel one
    assert "1|data_loader|" in per_rank and "0|collective|dp:all_reduce|" in per_rank
    assert resumed.value("trainmon_training_stalled", job=JOB, rank="0") == 0.0


def test_four_ranks_one_stuck_on_a_lock_between_backward_and_the_optimizer_step(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    """Rank 2 of 4 waits at step 20 for a lock nobody releases, after its backward: it is
    named, in its own code, with its frame; the three others wait in the all-reduce."""
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {"training": {"socket": socket}}})
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, socket, release, "--hang-rank", "-1", "--lock-rank", "2",
                        "--lock-at", "20", "--steps", "40", world_size=4)
    try:
        # the finding comes from the diagnosis' last evaluation (every few seconds): it
        # may still say "elsewhere" from before rank 2's own stall report arrived
        named = wait_for(daemon, lambda s: (hung_finding(s) or {}).get("rank") == "2" and len(
            [labels for labels in s.labelsets("trainmon_training_stall_info")
             if labels["job"] == JOB]) == 4, END_DEADLINE_SECONDS)
        release.touch()
        for process in ranks:
            assert process.wait(END_DEADLINE_SECONDS) == 0
    finally:
        stop(ranks, release)
    finding = hung_finding(named)
    assert finding is not None and finding["rank"] == "2"
    where = {labels["rank"]: labels for labels in named.labelsets(
        "trainmon_training_stall_info") if labels["job"] == JOB}
    assert where["2"]["where"] == "code"
    assert where["2"]["frame"].endswith(" wait_for_the_lock")
    assert {rank: where[rank]["where"] for rank in ("0", "1", "3")} == dict.fromkeys(
        ("0", "1", "3"), "collective")


def test_a_rank_killed_while_the_job_hangs_is_named_as_gone(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    """Rank 1 blocks in its Dataset, rank 0 waits for it; then rank 1 is killed with
    SIGKILL: its reporter falls silent without a word and, 30 s on, it is named as gone
    (gloo ends rank 0's wait with an error at once, so rank 0 crashes; with NCCL it would
    wait on, and the finding would say the same)."""
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {"training": {"socket": socket}}})
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, socket, release)
    try:
        wait_for(daemon, lambda s: hung_finding(s) is not None, END_DEADLINE_SECONDS)
        ranks[1].kill()
        ranks[1].wait()
        killed = time.time()
        gone = wait_for(daemon, lambda s: (hung_finding(s) or {}).get("rank") == "1"
                        and _where(daemon) == "gone", NAMED_WITHIN_SECONDS)
    finally:
        stop(ranks, release)
    assert hung_finding(gone) is not None
    assert time.time() - killed < NAMED_WITHIN_SECONDS


def _where(daemon: Daemon) -> str:
    """Where ``doctor --json`` says the job's hung rank is."""
    done = subprocess.run(
        [*trainmon_command(), "doctor", "--url", f"http://127.0.0.1:{daemon.port}",
         "--seconds", "1", "--json"], capture_output=True, text=True, timeout=60)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return ""
    for job in report.get("jobs", []):
        for finding in job.get("findings", []) if job.get("job") == JOB else []:
            if finding["code"] == "hung_rank":
                return str(finding["values"].get("where", ""))
    return ""


def test_two_nodes_the_lagging_rank_is_named_by_the_recording_rule_in_prometheus(
    tmp_path: Path, start_daemon: Callable[..., Daemon], prometheus: Prometheus,
) -> None:
    """Two daemons, two ranks each (ranks 0-1 on the first, 2-3 on the second); rank 3's
    Dataset blocks from step 30. The first node sees only ranks waiting in the all-reduce;
    the shipped rule ``job_rank:trainmon_training_collective_lag:max`` in a real
    Prometheus scraping both names rank 3, a step's buckets behind."""
    sockets = [str(tmp_path / f"steps-{node}.sock") for node in "ab"]
    daemons = [start_daemon(config={"collectors": {"training": {"socket": socket}}})
               for socket in sockets]
    prometheus.start({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules_path("dcgm"))],
        "scrape_configs": [{
            "job_name": "trainmon", "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"],
                                "labels": {"node": f"node-{node}"}}
                               for daemon, node in zip(daemons, "ab", strict=True)],
        }],
    })
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, sockets[0], release, "--hang-rank", "3", world_size=4,
                        endpoints=[f"unix://{sockets[rank // 2]}" for rank in range(4)])
    lag = 'job_rank:trainmon_training_collective_lag:max{job="hang"}'
    try:
        wait_until(lambda: any(float(s["value"][1]) > 0 for s in prometheus.query(lag)),
                   END_DEADLINE_SECONDS, f"no lagging rank:\n{prometheus.log()}")
        lags = {s["metric"]["rank"]: float(s["value"][1]) for s in prometheus.query(lag)}
        first = parse(daemons[0].metrics())
    finally:
        stop(ranks, release)
    assert max(lags, key=lags.__getitem__) == "3", lags
    assert {rank: lags[rank] for rank in "012"} == dict.fromkeys("012", 0.0)
    finding = hung_finding(first)
    assert finding is None or finding["rank"] == ""  # the first node cannot tell who


def test_slow_but_regular_steps_raise_nothing(
    tmp_path: Path, start_daemon: Callable[..., Daemon],
) -> None:
    """2 ranks whose every step takes 2 s (a slow GPU, a big batch), for 8 steps: longer
    than the 10 s floor in all, never 10 typical steps without one: no stall, no finding."""
    socket = str(tmp_path / "steps.sock")
    daemon = start_daemon(config={"collectors": {"training": {"socket": socket}}})
    release = tmp_path / "release"
    ranks = start_ranks(tmp_path, socket, release, "--hang-rank", "-1", "--steps", "8",
                        "--device-seconds", "2.0")
    seen_stall = seen_finding = False
    try:
        while any(process.poll() is None for process in ranks):
            scrape = parse(daemon.metrics())
            seen_stall |= any(value == 1.0 for value in scrape.samples.get(
                "trainmon_training_stalled", {}).values())
            seen_finding |= hung_finding(scrape) is not None
            time.sleep(0.5)
        assert [process.returncode for process in ranks] == [0, 0]
    finally:
        stop(ranks, release)
    assert not seen_stall and not seen_finding
