"""Helpers for the diagnosis tests (imported by the test modules and the conftest).

``job_verdicts(scrape)`` reads the per-job bottleneck from a rendering
(``support.exposition``); ``evaluated(registry)`` evaluates once, then scrapes;
``VerdictProbe`` is a derived collector after the diagnosis (where the ledger
is) that records the verdicts of every evaluation, and ``SteppingJob`` a real
``Reporter`` stepping in a thread. ``ProcTree`` and ``SysTree`` write miniature ``/proc`` and ``/sys`` trees. ``ContractSource`` is a
data source that emits metric-contract samples the test sets (a stand-in for
the GPU, training and node collectors below the diagnosis collector).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric

from testkit.exposition import Labels, Scrape, labels, scrape
from trainmon.client import Reporter
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry

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
