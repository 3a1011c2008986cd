"""A real rank in a real CPU-limited cgroup: its throttled seconds grow.

A busy-looping child process reports one step over the training socket (so the
kernel names its pid to the daemon) and is moved into a cgroup of this
machine's cpu controller with a quota of a tenth of a CPU: cgroup v1
(``<sys>/fs/cgroup/cpu/…``, ``cpu.cfs_quota_us``) where the cpu controller is
mounted there, else cgroup v2 (``cpu.max``) where the unified hierarchy offers
the cpu controller. The pressure collector, reading the host's ``/proc`` and
``/sys`` with the training store, must show the rank's throttled seconds
growing. The test creates and removes its cgroup; it is skipped where neither
hierarchy can be written (not root, no cpu controller).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.exposition import scrape
from testkit.prometheus import wait_until
from tests.training.training_support import line
from trainmon.collectors.pressure import PressureCollector
from trainmon.collectors.training import TrainingCollector

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The child's quota: 10 ms of CPU every 100 ms.
QUOTA_US, PERIOD_US = 10_000, 100_000
#: The child: send one report to the socket, say so, then spin.
BUSY_CHILD = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.sendto(sys.argv[1].encode(), sys.argv[2])\n"
    "print('sent', flush=True)\n"
    "while True:\n"
    "    pass\n"
)


def limited_cgroup() -> tuple[Path, Callable[[int], None]] | None:
    """A fresh cgroup with the quota, and how to move a pid into it; None where this
    machine offers no writable cpu controller."""
    name = f"trainmon-test-{uuid.uuid4().hex[:12]}"
    v1 = CGROUP_ROOT / "cpu"
    unified = CGROUP_ROOT / "cgroup.controllers"
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            folder = v1 / name
            folder.mkdir()
            (folder / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (folder / "cpu.cfs_quota_us").write_text(f"{QUOTA_US}\n")
        elif unified.exists() and "cpu" in unified.read_text().split():
            (CGROUP_ROOT / "cgroup.subtree_control").write_text("+cpu\n")
            folder = CGROUP_ROOT / name
            folder.mkdir()
            (folder / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}\n")
        else:
            return None
    except OSError:
        return None

    def move(pid: int) -> None:
        (folder / "cgroup.procs").write_text(f"{pid}\n")

    return folder, move


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, Callable[[int], None]]]:
    made = limited_cgroup()
    if made is None:
        pytest.skip("no writable cgroup cpu controller (v1 cpu or v2 with cpu) here")
    yield made
    folder = made[0]
    deadline = time.monotonic() + 10.0
    while folder.exists() and time.monotonic() < deadline:
        try:
            folder.rmdir()  # EBUSY while the killed child is still being reaped
        except OSError:
            time.sleep(0.05)
    assert not folder.exists(), f"{folder} left behind"


def test_a_throttled_rank_shows_growing_throttled_seconds(
    make_collector: Callable[..., TrainingCollector], socket_path: Path,
    cgroup: tuple[Path, Callable[[int], None]],
) -> None:
    training = make_collector(socket=socket_path)
    report = line(job="limited", rank=1, pid=1).decode()  # its own pid claim is not used
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD, report, str(socket_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "sent\n"
        folder, move = cgroup
        move(child.pid)
        assert str(child.pid) in (folder / "cgroup.procs").read_text().split()
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
        assert os.path.exists(f"/proc/{child.pid}")
    finally:
        child.kill()
        child.wait(timeout=10)
