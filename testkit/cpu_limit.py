"""A CPU limit a test puts on processes: a cgroup with a CPU quota, removed afterwards.

cgroup v2 (``cpu.max``) where the unified hierarchy is mounted with the ``cpu``
controller, else v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under the ``cpu``
hierarchy). ``CpuLimit.add(pid)`` moves a whole process (all its threads) into it;
leaving the ``with`` moves every process still in it back to the parent and removes the
cgroup. Root only; ``unavailable_reason()`` says why not where it cannot work.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from types import TracebackType

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_MICROSECONDS = 100_000


def _hierarchy() -> tuple[Path, int] | None:
    """The cpu controller's hierarchy and its cgroup version, None without one."""
    unified = CGROUP_ROOT / "cgroup.controllers"
    if unified.exists() and "cpu" in unified.read_text().split():
        return CGROUP_ROOT, 2
    v1 = CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, 1
    return None


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a cgroup"
    if _hierarchy() is None:
        return "no cgroup cpu controller is mounted"
    return None


class CpuLimit:
    """A cgroup whose processes share ``cpus`` CPUs (0.1: a tenth of one)."""

    def __init__(self, cpus: float, name: str = "") -> None:
        found = _hierarchy()
        if found is None:
            raise RuntimeError("no cgroup cpu controller is mounted")
        self.root, self.version = found
        self.path = self.root / (name or f"trainmon-test-{uuid.uuid4().hex[:8]}")
        self.cpus = cpus

    def __enter__(self) -> CpuLimit:
        self.path.mkdir()
        quota = max(1000, int(self.cpus * PERIOD_MICROSECONDS))
        if self.version == 2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_MICROSECONDS}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_MICROSECONDS))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        return self

    def add(self, pid: int) -> None:
        """Move process ``pid`` (every thread of it) into the limit."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_seconds(self) -> float:
        """CPU time the limit held back so far (cpu.stat)."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines()
                    if line.strip())
        if self.version == 2:
            return int(stat.get("throttled_usec", 0)) / 1e6
        return int(stat.get("throttled_time", 0)) / 1e9

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        parent = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                parent.write_text(pid)
        self.path.rmdir()
