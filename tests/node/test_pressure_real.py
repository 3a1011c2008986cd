"""A real rank in a real CPU-limited cgroup: its throttled seconds grow.

A busy-looping child process reports one step over the training socket (so the
kernel names its pid to the daemon) and is moved into a cgroup of this
machine's cpu controller with a quota of a tenth of a CPU (``testkit.cpu_limit``:
cgroup v2 ``cpu.max`` where the unified hierarchy offers the cpu controller,
else v1 ``cpu.cfs_quota_us``, as on this project's CI host). The pressure
collector, reading the host's ``/proc`` and ``/sys`` with the training store,
must show the rank's throttled seconds growing. The cgroup is created and
removed by the test; it is skipped where none can be (not root, no cpu
controller).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import cpu_limit
from testkit.exposition import scrape
from testkit.prometheus import wait_until
from tests.training.training_support import line
from trainmon.collectors.pressure import PressureCollector
from trainmon.collectors.training import TrainingCollector

#: The child: send one report to the socket, say so, then spin.
BUSY_CHILD = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.sendto(sys.argv[1].encode(), sys.argv[2])\n"
    "print('sent', flush=True)\n"
    "while True:\n"
    "    pass\n"
)


@pytest.mark.skipif(cpu_limit.unavailable_reason() is not None,
                    reason=str(cpu_limit.unavailable_reason()))
def test_a_throttled_rank_shows_growing_throttled_seconds(
    make_collector: Callable[..., TrainingCollector], socket_path: Path,
) -> None:
    training = make_collector(socket=socket_path)
    report = line(job="limited", rank=1, pid=1).decode()  # its own pid claim is not used
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD, report, str(socket_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "sent\n"
        with cpu_limit.CpuLimit(0.1) as limit:  # 10 ms of CPU every 100 ms
            limit.add(child.pid)
            assert str(child.pid) in (limit.path / "cgroup.procs").read_text().split()
            watch_throttling(training, limit)
    finally:
        child.kill()
        child.wait(timeout=10)


def watch_throttling(training: TrainingCollector, limit: cpu_limit.CpuLimit) -> None:
    """The collector's figure for the rank appears, grows, and is the cgroup's own."""
    pressure = PressureCollector(Path("/proc"), Path("/sys"), training.store)

    def throttled() -> float | None:
        return scrape(pressure).value(
            "trainmon_training_rank_cpu_throttled_seconds_total", job="limited", rank="1")

    wait_until(lambda: (throttled() or 0.0) > 0.0, 10.0,
               "the rank's cgroup shows throttled time", interval=0.05)
    first = throttled()
    assert first is not None
    # a tenth of a CPU for a spinning process: ~90 ms throttled in every 100 ms period
    wait_until(lambda: (throttled() or 0.0) >= first + 0.2, 10.0,
               "the throttled time grows", interval=0.05)
    assert pressure.health()["ranks_measured"] == 1
    exported = throttled()
    assert exported is not None and exported <= limit.throttled_seconds()
